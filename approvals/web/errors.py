"""The app's error pages (the project's handler403/404/500 may name them: the demo project
does), and axes' lockout page: JSON under the API, the app's own pages otherwise."""

from __future__ import annotations

from django.conf import settings
from django.contrib.staticfiles.storage import staticfiles_storage
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseServerError,
    JsonResponse,
)
from django.template.loader import render_to_string
from django.views import defaults

from .. import permissions
from ..permissions import (
    permission_needed,
)
from .mounts import is_api_request
from .render import render_page

VIEW_REQUESTS = permissions.VIEW_REQUESTS
VIEW_RUNS = permissions.VIEW_RUNS
START = permissions.START_PERMISSION
DECIDE = permissions.DECIDE_PERMISSION


def _is_api(request: HttpRequest) -> bool:
    return is_api_request(request)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: JSON under the API, else the app's own page (its header and stylesheet,
    readable on a phone) with a way back to the inbox."""
    if _is_api(request):
        return JsonResponse({"detail": "Not Found: no endpoint at this URL"}, status=404)
    return render_page(request, "approvals/404.html", status=404)


def locked_out(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """django-axes' answer to a locked-out sign-in (AXES_LOCKOUT_CALLABLE): a page saying
    for how long, with status 429 and Retry-After."""
    cooloff = settings.AXES_COOLOFF_TIME
    seconds = int(cooloff.total_seconds()) if cooloff else 0
    context = {
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "minutes": max(1, round(seconds / 60)) if seconds else None,
    }
    response = render_page(request, "approvals/locked_out.html", context, status=429)
    if seconds:
        response["Retry-After"] = str(seconds)
    return response


def _stylesheet_url() -> str | None:
    """app.css's URL, or None: with DEBUG off the manifest storage raises for a file that
    `collectstatic` did not collect (with no manifest every other page fails: this one must not)."""
    try:
        return staticfiles_storage.url("approvals/app.css")
    except Exception:
        return None


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: JSON under the API, else a page readable on a phone that cannot fail in
    turn. Something is broken when it shows, so it reads nothing that may be: the template
    is rendered without the request (no context processor, user, session or query) and the
    stylesheet's URL is looked up here, guarded; Django's own plain page if even that
    template fails."""
    if _is_api(request):
        return JsonResponse({"detail": "Internal server error"}, status=500)
    try:
        html = render_to_string("approvals/500.html", {"stylesheet": _stylesheet_url()})
    except Exception:
        return defaults.server_error(request)
    return HttpResponseServerError(html)


# What each page or action needs: `permission_required(..., raise_exception=True)` raises a
# PermissionDenied that names nothing, so the 403 page looks the permission up here.
PERMISSION_OF_URL = {
    "inbox": VIEW_REQUESTS,
    "request-card": VIEW_REQUESTS,
    "request-detail": VIEW_REQUESTS,
    "request-approve": DECIDE,
    "request-output": DECIDE,
    "request-edit": DECIDE,
    "request-respond": DECIDE,
    "request-calls": DECIDE,
    "request-decline": DECIDE,
    "run-list": VIEW_RUNS,
    "run-detail": VIEW_RUNS,
    "run-start": START,
    "run-retry": START,
    "run-cancel": DECIDE,
}


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """403 that says which permission is missing: a page of the app (htmx requests get just
    the message, which the page shows as a banner; the API keeps JSON)."""
    message = str(exception or "")
    if not message.startswith("You need"):
        match = request.resolver_match
        ours = match is not None and match.app_names[-1:] == ["approvals"]
        perm = PERMISSION_OF_URL.get(match.url_name) if ours else None
        if perm and not request.user.has_perm(perm):
            message = permission_needed(perm)
        elif message:
            message = f"{message[:1].upper()}{message[1:]}. Ask an administrator."
        else:
            message = "Your account may not do this. Ask an administrator."
    if _is_api(request):
        return JsonResponse({"detail": message}, status=403)
    if request.headers.get("HX-Request") == "true":
        return render_page(request, "approvals/403.html#denied", {"message": message}, status=403)
    return render_page(request, "approvals/403.html", {"message": message}, status=403)
