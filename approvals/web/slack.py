"""Slack's side: the actions endpoint its Approve / Decline buttons post to, the page that
links a Slack user to a person's account, and the Notifications page's "Unlink".

The actions endpoint has no CSRF token (Slack cannot send one) and no session: it is
authenticated by Slack's signature alone (`services.slack.slack_action`). It answers 200
with an empty body once the click was taken, whatever came of it: the clicker hears the
outcome from an ephemeral message, as Slack expects. A refused request says why as text.

The link page's GET only shows what it would do (after sign-in); its POST links."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from ..services import slack as slack_services
from .render import render_page


@csrf_exempt
@require_POST
def slack_actions(request: HttpRequest) -> HttpResponse:
    try:
        slack_services.slack_action(
            body=request.body,
            timestamp=request.headers.get("X-Slack-Request-Timestamp"),
            signature=request.headers.get("X-Slack-Signature"),
        )
    except slack_services.SlackRefused as exc:
        return HttpResponse(str(exc), status=exc.status, content_type="text/plain; charset=utf-8")
    return HttpResponse(status=200)


@require_http_methods(["GET", "POST"])
@login_required
def slack_link(request: HttpRequest, token: str) -> HttpResponse:
    """GET: "Link Slack user X to your account?"; POST (from it): the link."""
    try:
        offer = slack_services.slack_link_check(token)
        if request.method == "POST":
            slack_services.slack_link(token=token, user=request.user)
            messages.success(
                request,
                f"Slack user {offer.slack_name} is linked to your account: their Approve and"
                " Decline clicks now decide as you.",
            )
            return redirect("approvals:notifications")
    except slack_services.BadSlackLink as exc:
        context = {"title": exc.title, "message": str(exc)}
        return render_page(request, "approvals/notify_link.html", context, status=exc.status)
    context = {
        "offer": offer,
        "mine": offer.linked_to is not None and offer.linked_to.pk == request.user.pk,
        "theirs": offer.linked_to is not None and offer.linked_to.pk != request.user.pk,
    }
    return render_page(request, "approvals/slack_link.html", context)


@require_POST
@login_required
def slack_unlink(request: HttpRequest, link_id: int) -> HttpResponse:
    if slack_services.slack_unlink(user=request.user, link_id=link_id):
        messages.success(request, "Slack user unlinked: their clicks no longer decide as you.")
    else:
        messages.error(request, "No such Slack link of yours.")
    return redirect("approvals:notifications")
