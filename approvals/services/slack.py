"""Slack's Approve / Decline clicks, and the links that connect a Slack user to a person.

A click is taken only when Slack signed it (the signing secret, within five minutes), on a
message this app posted, from its workspace. Its Slack user decides as the person they are
linked to, through the same decision services as the inbox: permissions, rules and
two-person approval all apply. Whatever the outcome, the clicker hears it (an ephemeral
answer) and the message shows the request as it now stands; both go through the task queue,
after the decision's own transaction.

A Slack user who is not linked yet gets a signed link (theirs alone, for 15 minutes) to a
page of the app where, signed in, a person confirms the link with a POST."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse

from ..conf import app_settings
from ..domain.exceptions import AlreadyDecided, NotAllowed, ServiceError
from ..execution import notifications, slack
from ..models import ApprovalRequest, SlackLink, SlackMessage
from ..selectors import active_claim
from .requests import request_approve, request_decline


class SlackRefused(ServiceError):
    """A Slack request that is not taken: unsigned, forged, stale, malformed or foreign.
    Nothing was changed; the message says why."""

    def __init__(self, message: str, *, status: int = 400):
        super().__init__(message)
        self.status = status


class BadSlackLink(ServiceError):
    """A link that cannot connect a Slack user: forged, expired, or the Slack user is
    someone else's. `title` heads the page that says so."""

    def __init__(self, title: str, message: str, *, status: int = 400):
        super().__init__(message)
        self.title = title
        self.status = status


@dataclass(frozen=True)
class SlackClick:
    team_id: str
    slack_user_id: str
    slack_name: str
    action: str  # slack.APPROVE or slack.DECLINE
    request_id: str
    channel: str
    message_ts: str
    reason: str


def _parse(body: bytes) -> SlackClick:
    """The click in a `block_actions` payload (form-encoded JSON, as Slack sends it)."""
    try:
        fields = parse_qs(body.decode("utf-8"), strict_parsing=True)
        payload = json.loads(fields["payload"][0])
        if payload.get("type") != "block_actions":
            raise SlackRefused("Only Approve and Decline clicks are taken here.")
        user = payload["user"]
        team = payload.get("team") or {}
        actions = [
            a
            for a in payload.get("actions") or []
            if a.get("action_id") in (slack.APPROVE, slack.DECLINE)
        ]
        if len(actions) != 1:
            raise SlackRefused("Not an Approve or Decline click.")
        container = payload.get("container") or {}
        channel = container.get("channel_id") or (payload.get("channel") or {}).get("id") or ""
        values = (payload.get("state") or {}).get("values") or {}
        reason = ((values.get(slack.REASON_BLOCK) or {}).get(slack.REASON_INPUT) or {}).get("value")
        return SlackClick(
            team_id=str(team.get("id") or user.get("team_id") or ""),
            slack_user_id=str(user["id"]),
            slack_name=str(user.get("username") or user.get("name") or user["id"])[:100],
            action=actions[0]["action_id"],
            request_id=str(actions[0].get("value") or ""),
            channel=str(channel),
            message_ts=str(
                container.get("message_ts") or (payload.get("message") or {}).get("ts") or ""
            ),
            reason=str(reason or "")[:500],
        )
    except SlackRefused:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        raise SlackRefused("The request is not a Slack action payload: nothing was done.") from None


def slack_action(*, body: bytes, timestamp: str | None, signature: str | None) -> str:
    """Take one click from Slack (the raw body and its signature headers); what came of it.
    SlackRefused (nothing changed) when the request is not Slack's, or not about a message
    this app posted."""
    if not slack.enabled():
        raise SlackRefused("Slack is not set up on this server.", status=404)
    if not slack.verify(body, timestamp, signature):
        raise SlackRefused(
            "The Slack signature is missing, wrong or too old: nothing was done.", status=401
        )
    click = _parse(body)
    team = app_settings.SLACK_TEAM_ID
    if team and click.team_id != team:
        raise SlackRefused("This app takes actions from its own Slack workspace only.", status=403)
    posted = (
        SlackMessage.objects.filter(
            request__request_id=click.request_id, channel=click.channel, ts=click.message_ts
        )
        .select_related("request")
        .first()
    )
    if posted is None or not click.message_ts:
        raise SlackRefused(
            "This action is not on a message this app posted: nothing was done.", status=403
        )
    link = (
        SlackLink.objects.filter(
            team_id=click.team_id, slack_user_id=click.slack_user_id, user__is_active=True
        )
        .select_related("user")
        .first()
    )
    if link is None:
        _answer(click, _link_invitation(click))
        return "not linked"
    return _decide(click, link.user, posted)


def _answer(click: SlackClick, text: str) -> None:
    transaction.on_commit(lambda: slack.queue_answer(click.channel, click.slack_user_id, text))


def _link_invitation(click: SlackClick) -> str:
    token = slack.make_link_token(click.team_id, click.slack_user_id, click.slack_name)
    url = notifications.public_url(reverse("approvals:slack-link", args=[token]))
    return (
        "Nothing was decided: your Slack user is not linked to a toolnexus account yet."
        f" <{url}|Link it to yours> (the link works for 15 minutes, for you alone),"
        " then click again."
    )


def _decide(click: SlackClick, user: Any, posted: SlackMessage) -> str:
    row = posted.request
    request_id = row.request_id
    holder = active_claim(row)
    if holder is not None and holder.pk != user.pk:
        _answer(
            click,
            f"Nothing was decided: {holder.get_username()} claimed this request. Open it to"
            f" take the claim over: {slack.request_url(row)}",
        )
        return "claimed"
    try:
        with transaction.atomic():
            if click.action == slack.APPROVE:
                decided = request_approve(request_id=request_id, user=user)
            else:
                decided = request_decline(request_id=request_id, user=user, reason=click.reason)
    except AlreadyDecided as exc:
        who = exc.decided_by or "the system"
        _answer(click, f"Already {exc.state} by {who}: nothing was changed.")
        _update(posted)  # the message may still show the buttons (decided elsewhere)
        return "already decided"
    except (NotAllowed, ApprovalRequest.DoesNotExist) as exc:
        why = str(exc) if isinstance(exc, NotAllowed) else "you may not see this request"
        _answer(click, f"Nothing was decided: {slack.escape(why)}.")
        return "not allowed"
    except ServiceError as exc:
        _answer(click, f"Nothing was decided: {slack.escape(str(exc))}")
        return "refused"
    partial = getattr(decided, "partial_approval", None)
    if partial is not None:
        _answer(click, f"Your approval is recorded ({partial.message}); it needs more.")
    _update(posted)
    return "partial" if partial is not None else decided.state


def _update(posted: SlackMessage) -> None:
    transaction.on_commit(lambda: slack.queue_update(posted.pk))


# -- linking -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkOffer:
    team_id: str
    slack_user_id: str
    slack_name: str
    linked_to: Any  # the person this Slack user is linked to now, or None


def slack_link_check(token: str) -> LinkOffer:
    """The Slack user a link would connect, or BadSlackLink saying why not."""
    try:
        data = slack.read_link_token(token)
    except signing.SignatureExpired:
        raise BadSlackLink(
            "This link has expired",
            "A Slack link works for 15 minutes. Click Approve or Decline in Slack again for"
            " a new one.",
            status=410,
        ) from None
    except signing.BadSignature:
        raise BadSlackLink(
            "This link is not valid",
            "It was not made by this server, or it was changed on the way. Nothing was done.",
        ) from None
    found = SlackLink.objects.filter(team_id=data["t"], slack_user_id=data["s"]).first()
    return LinkOffer(
        team_id=data["t"],
        slack_user_id=data["s"],
        slack_name=str(data.get("n") or data["s"]),
        linked_to=found.user if found else None,
    )


def slack_link(*, token: str, user: Any) -> SlackLink:
    """Link the token's Slack user to `user` (the page's POST). A Slack user linked to
    someone else stays theirs: they unlink it first."""
    offer = slack_link_check(token)
    if offer.linked_to is not None and offer.linked_to.pk != user.pk:
        raise BadSlackLink(
            "This Slack user is someone else's",
            "It is linked to another account: that person unlinks it on their Notifications"
            " page first. Nothing was done.",
            status=409,
        )
    try:
        with transaction.atomic():
            link, _ = SlackLink.objects.update_or_create(
                team_id=offer.team_id,
                slack_user_id=offer.slack_user_id,
                defaults={"user": user, "slack_name": offer.slack_name},
            )
    except IntegrityError:  # linked by a concurrent POST
        raise BadSlackLink(
            "This Slack user is already linked", "Nothing more to do.", status=409
        ) from None
    return link


def slack_unlink(*, user: Any, link_id: int) -> int:
    """Remove one of the user's own Slack links; how many were removed (0: not theirs)."""
    with transaction.atomic():
        removed, _ = SlackLink.objects.filter(user=user, pk=link_id).delete()
    return removed
