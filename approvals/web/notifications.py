"""The Notifications page (each person's own settings, the browsers where they turned push
on, and a "send a test" button per channel), the endpoints its push button uses (the
subscription's POST, the service worker's script) and the pages an email's signed Approve /
Decline links open.

A link's GET only shows what it would do (after sign-in: `login_required` brings the person
back to it); its POST decides through `services.notifications.link_decide`, which uses the
normal decision services and permissions. A link that cannot be used says why on a page of
its own and changes nothing."""

from __future__ import annotations

import json
from contextlib import suppress
from functools import cache
from pathlib import Path

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from .. import selectors, services
from ..domain.exceptions import AlreadyDecided, NotAllowed, ServiceError
from ..domain.push import MAX_BODY
from ..models import WebPushSubscription
from ..presenters import cards
from ..presenters.notifications import NotificationPreferenceForm, notifications_page
from ..services import notifications as notification_services
from .render import render_page


@require_http_methods(["GET", "POST"])
@login_required
def notification_settings(request: HttpRequest) -> HttpResponse:
    pref = selectors.notification_preference(request.user)
    form = NotificationPreferenceForm(request.POST or None, instance=pref)
    if request.method == "POST" and form.is_valid():
        notification_services.notification_save(form.save(commit=False))
        messages.success(request, "Notification settings saved.")
        return redirect("approvals:notifications")
    status = 400 if request.method == "POST" else 200
    recent = selectors.notification_recent(request.user) if pref.pk else []
    devices = selectors.push_subscriptions(request.user)
    links = selectors.slack_links(request.user)
    context = {"nav": "notifications", **notifications_page(form, recent, devices, links)}
    return render_page(request, "approvals/notifications.html", context, status=status)


@require_POST
@login_required
def notification_test(request: HttpRequest, channel: str) -> HttpResponse:
    try:
        sent = notification_services.notification_test(user=request.user, channel=channel)
    except NotAllowed as exc:
        messages.error(request, f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
    except ServiceError as exc:
        messages.error(request, f"No test sent: {exc}.")
    else:
        messages.success(
            request, f"Test queued ({sent} message(s)); its outcome shows under Recent messages."
        )
    return redirect("approvals:notifications")


@require_POST
def push_subscribe(request: HttpRequest) -> HttpResponse:
    """The push button's POST (approvals/static/approvals/push.js): the browser's
    subscription as JSON, answered in JSON (400 says what is wrong with it)."""
    if not request.user.is_authenticated:  # a script's fetch: no sign-in page to follow
        return JsonResponse({"error": "sign in first"}, status=401)
    if len(request.body) > MAX_BODY:
        return JsonResponse({"error": f"the body is over {MAX_BODY} bytes"}, status=400)
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        return JsonResponse({"error": "the body is not JSON"}, status=400)
    try:
        row = notification_services.push_subscribe(
            user=request.user, data=data, user_agent=request.headers.get("User-Agent", "")
        )
    except ServiceError as exc:
        return JsonResponse({"error": str(exc)}, status=exc.status)
    messages.success(request, "Push is on for this browser.")
    return JsonResponse({"id": row.pk})


@require_POST
@login_required
def push_remove(request: HttpRequest, subscription_id: int) -> HttpResponse:
    try:
        notification_services.push_unsubscribe(user=request.user, subscription_id=subscription_id)
    except WebPushSubscription.DoesNotExist:
        raise Http404("no such browser of yours") from None
    messages.success(request, "That browser no longer gets push.")
    return redirect("approvals:notifications")


@cache
def _service_worker_script() -> bytes:
    # Read from the app's own files (not STATIC_ROOT, not a CDN): a service worker must come
    # from the page's origin, at a path whose folder covers the pages it serves.
    return (Path(__file__).resolve().parent.parent / "static/approvals/sw.js").read_bytes()


@require_GET
def service_worker(request: HttpRequest) -> HttpResponse:
    """approvals/static/approvals/sw.js at the app's root URL, so its scope is every page of
    the app wherever it is mounted (from /static/ its scope would be /static/ only)."""
    response = HttpResponse(_service_worker_script(), content_type="application/javascript")
    response["Service-Worker-Allowed"] = reverse("approvals:inbox")
    # Browsers check for a new worker on each registration; no cached copy hides one.
    response["Cache-Control"] = "no-cache"
    return response


def _bad_link(request: HttpRequest, exc: notification_services.BadLink) -> HttpResponse:
    context = {"title": exc.title, "message": str(exc)}
    return render_page(request, "approvals/notify_link.html", context, status=exc.status)


@require_http_methods(["GET", "POST"])
@login_required
def notify_link(request: HttpRequest, token: str) -> HttpResponse:
    """GET: the confirmation page; POST (from it): the decision, once."""
    try:
        link = notification_services.link_check(token, request.user)
    except notification_services.BadLink as exc:
        return _bad_link(request, exc)
    row = link.request
    page = reverse("approvals:request-detail", args=[row.request_id])
    holder = selectors.active_claim(row)
    claimed_by_other = holder is not None and holder.pk != request.user.pk
    if request.method == "POST" and claimed_by_other and not request.POST.get("takeover"):
        # A claim taken after the page was drawn: ask again, as the inbox does.
        return _confirm_page(request, link, holder, status=409)
    if request.method == "POST":
        if claimed_by_other:
            # As the inbox's takeover (web/triage.claim_guard): the decision below says what
            # is wrong if this fails.
            with suppress(ServiceError):
                services.request_claim(request_id=row.request_id, user=request.user, takeover=True)
        try:
            notification_services.link_decide(
                token=token, user=request.user, reason=request.POST.get("reason", "")
            )
        except notification_services.BadLink as exc:
            return _bad_link(request, exc)
        except AlreadyDecided as exc:
            message = cards.nothing_changed(exc.state, exc.decided_by, exc.decided_at)
            return render_page(
                request,
                "approvals/notify_link.html",
                {"title": "Already decided", "message": message, "page": page},
                status=409,
            )
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        except ServiceError as exc:
            return render_page(
                request,
                "approvals/notify_link.html",
                {"title": "Nothing was decided", "message": str(exc), "page": page},
                status=400,
            )
        messages.success(request, "Approved." if link.action == "approve" else "Declined.")
        return redirect(page)
    if row.state != row.State.PENDING:
        message = cards.nothing_changed(
            row.state, row.decided_by.get_username() if row.decided_by else None, row.decided_at
        )
        context = {"title": "Already decided", "message": message, "page": page}
        return render_page(request, "approvals/notify_link.html", context, status=409)
    return _confirm_page(request, link, holder if claimed_by_other else None)


def _confirm_page(
    request: HttpRequest, link: notification_services.SignedLink, holder, *, status: int = 200
) -> HttpResponse:
    row = link.request
    what, summary = cards.row_summary(row)
    context = {
        "action": link.action,
        "row": row,
        "what": what,
        "summary": summary,
        "page": reverse("approvals:request-detail", args=[row.request_id]),
        "claimed_by": holder.get_username() if holder is not None else "",
    }
    return render_page(request, "approvals/notify_confirm.html", context, status=status)
