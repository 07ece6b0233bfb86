"""The Notifications page (each person's own settings, and a "send a test" button per
channel) and the pages an email's signed Approve / Decline links open.

A link's GET only shows what it would do (after sign-in: `login_required` brings the person
back to it); its POST decides through `services.notifications.link_decide`, which uses the
normal decision services and permissions. A link that cannot be used says why on a page of
its own and changes nothing."""

from __future__ import annotations

from contextlib import suppress

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from .. import selectors, services
from ..domain.exceptions import AlreadyDecided, NotAllowed, ServiceError
from ..presenters import cards
from ..presenters.notifications import NotificationPreferenceForm, notifications_page
from ..services import notifications as notification_services
from .views import _render


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
    links = selectors.slack_links(request.user)
    context = {"nav": "notifications", **notifications_page(form, recent, links)}
    return _render(request, "approvals/notifications.html", context, status=status)


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


def _bad_link(request: HttpRequest, exc: notification_services.BadLink) -> HttpResponse:
    context = {"title": exc.title, "message": str(exc)}
    return _render(request, "approvals/notify_link.html", context, status=exc.status)


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
            return _render(
                request,
                "approvals/notify_link.html",
                {"title": "Already decided", "message": message, "page": page},
                status=409,
            )
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        except ServiceError as exc:
            return _render(
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
        return _render(request, "approvals/notify_link.html", context, status=409)
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
    return _render(request, "approvals/notify_confirm.html", context, status=status)
