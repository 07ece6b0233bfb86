"""The web request's part of traces and logs."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, get_resolver

from . import logs, tracing


def username_of(user: Any) -> str:
    return user.get_username() if user is not None and user.is_authenticated else ""


class TelemetryMiddleware:
    """Every log line written while a request is handled names its user and, for a URL about
    a run or a request (`<run_id>`, `<request_id>`), that id; the same ids go on the
    request's span when tracing is on. Put it after AuthenticationMiddleware, beside the
    other sync-only middleware. An API call authenticated by a bearer token names its user
    once the token is checked (api.core).

    Sync only, with no `process_view`: under ASGI each hook of a sync middleware that the
    chain's mode does not match is one more crossing from the event loop into a thread, so
    the path is resolved here (a few regex matches) rather than in a view hook."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with logs.scope():
            self._bind(request)
            return self.get_response(request)

    def _bind(self, request: HttpRequest) -> None:
        try:
            match = get_resolver(getattr(request, "urlconf", None)).resolve(request.path_info)
        except Resolver404:
            match = None
        found = match.kwargs if match is not None else {}
        run_id, request_id = found.get("run_id"), found.get("request_id")
        user = getattr(request, "user", None)
        signed_in = user is not None and user.is_authenticated
        logs.bind(
            user=username_of(user),
            user_id=user.pk if signed_in else None,
            run_id=run_id,
            request_id=request_id,
        )
        tracing.annotate(run_id=run_id, request_id=request_id)
