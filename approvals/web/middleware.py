"""Request guards that hold for every entry point, before any view runs."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes, urlsplit

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import resolve_url

from .mounts import is_api_request

_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def _refuse(request: HttpRequest, status: int, detail: str) -> HttpResponse:
    if is_api_request(request):
        return JsonResponse({"detail": detail}, status=status)
    return HttpResponse(detail, status=status, content_type="text/plain; charset=utf-8")


class RequestGuardMiddleware:
    """Refuse what no view can store: bodies over the size limit (even where a view never
    reads its body) and NUL characters (PostgreSQL text cannot hold them), with a clear 4xx
    instead of a database error halfway through a request. On the way out, an htmx request
    sent to the sign-in page gets 401 instead (`signed_out_for_htmx`)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path:
            return _refuse(request, 400, "NUL characters are not allowed in a URL")
        # Pages drop a NUL from their filters; the API says so.
        query = request.META.get("QUERY_STRING", "")
        if b"\x00" in unquote_to_bytes(query) and is_api_request(request):
            return _refuse(request, 400, "NUL characters are not allowed in a URL")
        if request.method in _BODY_METHODS:
            try:
                body = request.body
            except RequestDataTooBig:
                return _refuse(request, 413, "request body too large")
            form = request.content_type == "application/x-www-form-urlencoded"
            if b"\x00" in body or (form and b"\x00" in unquote_to_bytes(body.replace(b"+", b" "))):
                return _refuse(request, 400, "NUL characters are not allowed in a request body")
        return signed_out_for_htmx(request, self.get_response(request))


SIGNED_OUT_TEXT = "You are signed out: sign in again. Nothing was sent."


def signed_out_for_htmx(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """An htmx request from a page whose session ended gets 401, not the redirect to the
    sign-in page: the browser would follow it and htmx would swap the sign-in page into the
    inbox. The page (approvals/app.js) shows a "signed out" banner and keeps what was typed.
    The app's own pages do this without the middleware (`views.app_page`)."""
    if request.headers.get("HX-Request") != "true" or response.status_code not in (301, 302, 303):
        return response
    login = urlsplit(resolve_url(settings.LOGIN_URL)).path
    if urlsplit(response.get("Location", "")).path != login:
        return response
    signed_out = HttpResponse(SIGNED_OUT_TEXT, status=401, content_type="text/plain; charset=utf-8")
    signed_out["WWW-Authenticate"] = 'Session realm="toolnexus"'
    return signed_out
