"""Slack: each new request is posted to the team's channel with Approve / Decline buttons
(Block Kit), and the message is updated in place with the outcome and who decided.

- `dispatch` (the delivery worker, beside the notifications' dispatch) reads the
  "request.created" host events after its cursor and makes a `SlackMessage` per request,
  posted by `post_slack_message`; the "request.decided" events queue the update of the
  requests' messages, wherever the decision was made (the inbox, the API, Slack).
- The tasks run on the webhooks' queue, which the run worker never takes: nothing here
  delays a decision or a resume. A failed post is recorded on its row and retried after a
  growing wait (the notifications' backoff), then given up.
- The actions endpoint's decisions are made by services.slack; this module verifies the
  requests' signatures and makes the signed links that connect a Slack user to a person.

Everything here runs only when the bot token, the signing secret and the channel are set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.core import signing
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django_tasks import task
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ContextBlock,
    HeaderBlock,
    InputBlock,
    MarkdownTextObject,
    PlainTextInputElement,
    SectionBlock,
)
from slack_sdk.signature import SignatureVerifier

from .. import event_feed
from ..conf import WEBHOOK_QUEUE, app_settings
from ..domain import hostevents
from ..domain.summaries import request_key_arguments, request_what
from ..models import ApprovalGiven, ApprovalRequest, SlackCursor, SlackMessage
from . import notifications

log = logging.getLogger(__name__)

PENDING = SlackMessage.State.PENDING
POSTED = SlackMessage.State.POSTED
FAILED = SlackMessage.State.FAILED

# The ids of the message's interactive parts, which the actions endpoint reads back.
APPROVE = "approve"
DECLINE = "decline"
ACTIONS_BLOCK = "decide"
REASON_BLOCK = "reason"
REASON_INPUT = "reason"
# The kinds a button may decide as shown (a question needs its typed answer: in the inbox).
BUTTON_KINDS = notifications.LINK_KINDS

LINK_SALT = "approvals.slack.link"
LINK_SECONDS = 15 * 60


def enabled() -> bool:
    return bool(
        app_settings.SLACK_BOT_TOKEN
        and app_settings.SLACK_SIGNING_SECRET
        and app_settings.SLACK_CHANNEL
    )


# -- what Slack sends us -------------------------------------------------------------------------


def verify(body: bytes, timestamp: str | None, signature: str | None) -> bool:
    """Whether Slack signed this request body with the app's signing secret within the last
    five minutes (the SDK's verifier: an older timestamp is a replay)."""
    if not enabled():
        return False
    verifier = SignatureVerifier(app_settings.SLACK_SIGNING_SECRET)
    try:
        return verifier.is_valid(body=body, timestamp=timestamp, signature=signature)
    except ValueError:  # a timestamp that is not a number
        return False


def make_link_token(team_id: str, slack_user_id: str, slack_name: str) -> str:
    """The token of a link that connects this Slack user to whoever opens it and confirms:
    sent to that Slack user alone (an ephemeral message), it expires (`read_link_token`)."""
    return signing.dumps({"t": team_id, "s": slack_user_id, "n": slack_name}, salt=LINK_SALT)


def read_link_token(token: str) -> dict[str, str]:
    """The token's payload; signing.SignatureExpired or signing.BadSignature."""
    data = signing.loads(token, salt=LINK_SALT, max_age=LINK_SECONDS)
    if not isinstance(data, dict) or not data.get("t") or not data.get("s"):
        raise signing.BadSignature("not a Slack link token")
    return data


# -- the message ---------------------------------------------------------------------------------


def escape(text: str) -> str:
    """Slack's mrkdwn escapes: a request's own text never becomes a link or a mention."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def request_url(row: ApprovalRequest) -> str:
    return notifications.public_url(reverse("approvals:request-detail", args=[row.request_id]))


def _approvers(row: ApprovalRequest) -> list[str]:
    given = ApprovalGiven.objects.filter(request=row).select_related("user")
    return [g.user.get_username() for g in given]


def fingerprint(row: ApprovalRequest) -> str:
    """What the message shows of the request: its state and the approvals given so far."""
    return f"{row.state}:{','.join(_approvers(row))}"[:100]


def outcome_text(row: ApprovalRequest) -> str:
    """ "Declined by ann: not this month", "Approved by bob", "Expired"."""
    who = row.decided_by.get_username() if row.decided_by else ""
    text = row.get_state_display().capitalize()
    if who:
        text += f" by {who}"
    # The default reasons ("declined", "expired") would only repeat the state.
    if row.reason and row.reason != row.state and row.state != ApprovalRequest.State.APPROVED:
        text += f": {row.reason}"
    return text


def message(row: ApprovalRequest) -> tuple[str, list[dict[str, Any]]]:
    """(fallback text, Block Kit blocks) of a request's message: its agent, tool and key
    arguments, its page's link and, while it waits, the buttons (with a reason field for a
    decline); once decided, the outcome and who decided."""
    what = request_what(row)
    arguments = request_key_arguments(row)
    title = f"{row.agent} wants {what}"
    lines = [f"*Agent:* {escape(row.agent)}", f"*Tool:* {escape(what)}"]
    if arguments:
        lines.append(f"*Arguments:* {escape(arguments)}")
    lines.append(f"<{request_url(row)}|Open the request>")
    blocks: list[Block] = [
        HeaderBlock(text=title[:150]),
        SectionBlock(text=MarkdownTextObject(text="\n".join(lines)[:3000])),
    ]
    pending = row.state == ApprovalRequest.State.PENDING
    approvers = _approvers(row)
    if pending and approvers:
        blocks.append(
            ContextBlock(
                elements=[MarkdownTextObject(text=escape(f"Approved by {', '.join(approvers)}"))]
            )
        )
    if pending and row.kind in BUTTON_KINDS:
        blocks.append(
            InputBlock(
                block_id=REASON_BLOCK,
                label="Reason (for Decline; the model reads it)",
                element=PlainTextInputElement(action_id=REASON_INPUT, max_length=500),
                optional=True,
            )
        )
        blocks.append(
            ActionsBlock(
                block_id=ACTIONS_BLOCK,
                elements=[
                    ButtonElement(
                        text="Approve", action_id=APPROVE, value=row.request_id, style="primary"
                    ),
                    ButtonElement(
                        text="Decline", action_id=DECLINE, value=row.request_id, style="danger"
                    ),
                ],
            )
        )
    elif pending:
        blocks.append(
            ContextBlock(elements=[MarkdownTextObject(text="Answer it on the request's page.")])
        )
    else:
        blocks.append(SectionBlock(text=MarkdownTextObject(text=f"*{escape(outcome_text(row))}*")))
    text = f"New request: {title}" if pending else f"{title}: {outcome_text(row)}"
    return text[:3000], [b.to_dict() for b in blocks]


# -- which requests get a message ----------------------------------------------------------------


def dispatch(limit: int = 200) -> int:
    """Make the messages of the requests created since the last call (and queue the updates
    of those decided); how many messages were made."""
    made = 0
    with transaction.atomic():
        cursor = SlackCursor.objects.select_for_update().filter(pk=1).first()
        if cursor is None:  # the first run posts from now on, never the past
            SlackCursor.objects.get_or_create(
                pk=1, defaults={"last_event_id": event_feed.latest_event_id()}
            )
            return 0
        events, after = event_feed.host_events_after(
            cursor.last_event_id,
            types=[hostevents.REQUEST_CREATED, hostevents.REQUEST_DECIDED],
            limit=limit,
        )
        created = [e.request_id for e in events if e.action in _CREATED_ACTIONS and e.request_id]
        decided = [e.request_id for e in events if e.action not in _CREATED_ACTIONS]
        made = _make_messages(created)
        for pk in SlackMessage.objects.filter(request_id__in=decided, state=POSTED).values_list(
            "pk", flat=True
        ):
            transaction.on_commit(lambda pk=pk: queue_update(pk))
        if after != cursor.last_event_id:
            cursor.last_event_id = after
            cursor.save(update_fields=["last_event_id"])
    return made


_CREATED_ACTIONS = hostevents.ACTIONS[hostevents.REQUEST_CREATED]


def _make_messages(request_pks: Iterable[int]) -> int:
    rows = ApprovalRequest.objects.filter(
        pk__in=list(request_pks), state=ApprovalRequest.State.PENDING
    ).exclude(pk__in=SlackMessage.objects.values("request_id"))
    made = 0
    for row in rows:
        msg = SlackMessage.objects.create(
            request=row, channel=app_settings.SLACK_CHANNEL, next_attempt_at=timezone.now()
        )
        transaction.on_commit(lambda pk=msg.pk: _queue_post(pk))
        made += 1
    return made


# -- the sending ---------------------------------------------------------------------------------


def client() -> WebClient:
    # No retries inside the client: a failure is recorded and retried by the queue.
    return WebClient(
        token=app_settings.SLACK_BOT_TOKEN,
        base_url=app_settings.SLACK_API_URL,
        timeout=int(app_settings.NOTIFICATION_TIMEOUT_SECONDS),
        retry_handlers=[],
    )


def _failure(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        said = exc.response.get("error") if exc.response is not None else None
        return f"Slack said {said or exc.response.status_code}"[:1000]
    return f"{type(exc).__name__}: {exc}"[:1000]


# Routed to its queue when queued, as `deliver_notification` is.
@task()
def post_slack_message(message_id: int) -> str:
    """The task: one attempt at posting one request's message."""
    return attempt_post(message_id)


@task()
def update_slack_message(message_id: int) -> str:
    """The task: show a posted message's request as it stands now."""
    return attempt_update(message_id)


@task()
def tell_slack_user(channel: str, slack_user_id: str, text: str) -> str:
    """The task: an ephemeral answer to one Slack user in the channel they clicked in."""
    try:
        client().chat_postEphemeral(channel=channel, user=slack_user_id, text=text)
    except Exception as exc:  # said once: the person can click again or open the request
        log.warning("Slack: could not answer %s: %s", slack_user_id, _failure(exc))
        return "failed"
    return "told"


def _queue_post(message_id: int, *, run_after: datetime | None = None) -> None:
    post_slack_message.using(queue_name=WEBHOOK_QUEUE, run_after=run_after).enqueue(message_id)


def queue_update(message_id: int, *, run_after: datetime | None = None) -> None:
    update_slack_message.using(queue_name=WEBHOOK_QUEUE, run_after=run_after).enqueue(message_id)


def queue_answer(channel: str, slack_user_id: str, text: str) -> None:
    tell_slack_user.using(queue_name=WEBHOOK_QUEUE).enqueue(channel, slack_user_id, text)


def attempt_post(message_id: int) -> str:
    msg = SlackMessage.objects.select_related("request__decided_by").filter(pk=message_id).first()
    if msg is None or msg.state != PENDING or not enabled():
        return "nothing to send"
    row = msg.request
    text, blocks = message(row)
    shown = fingerprint(row)
    # No transaction is held over the call: its outcome is written after it.
    try:
        answer = client().chat_postMessage(channel=msg.channel, text=text, blocks=blocks)
    except Exception as exc:
        return _record_post(message_id, error=_failure(exc))
    return _record_post(
        message_id,
        error="",
        channel=answer.get("channel", msg.channel),
        ts=answer["ts"],
        shown=shown,
    )


def _record_post(
    message_id: int, *, error: str, channel: str = "", ts: str = "", shown: str = ""
) -> str:
    now = timezone.now()
    with transaction.atomic():
        row = SlackMessage.objects.select_for_update().filter(pk=message_id).first()
        if row is None or row.state != PENDING:
            return "already settled"
        row.attempts += 1
        row.last_attempt_at = now
        row.last_error = error
        if not error:
            row.state, row.posted_at, row.next_attempt_at = POSTED, now, None
            row.channel, row.ts, row.shown = channel, ts, shown
            # Decided while it was being posted: the update shows it.
            transaction.on_commit(lambda: queue_update(message_id))
            outcome = "posted"
        elif row.attempts >= app_settings.NOTIFICATION_MAX_ATTEMPTS:
            row.state, row.next_attempt_at = FAILED, None
            outcome = "gave up"
            log.warning(
                "Slack message of request %s given up after %s attempts: %s",
                row.request_id,
                row.attempts,
                error,
            )
        else:
            row.next_attempt_at = now + notifications.backoff(row.attempts)
            _queue_post(row.pk, run_after=row.next_attempt_at)
            outcome = "will retry"
            log.info("Slack message %s failed (attempt %s): %s", row.pk, row.attempts, error)
        row.save()
    return outcome


def attempt_update(message_id: int) -> str:
    msg = SlackMessage.objects.select_related("request__decided_by").filter(pk=message_id).first()
    if msg is None or msg.state != POSTED or not enabled():
        return "nothing to update"
    row = msg.request
    shown = fingerprint(row)
    if shown == msg.shown:
        return "up to date"
    text, blocks = message(row)
    try:
        client().chat_update(channel=msg.channel, ts=msg.ts, text=text, blocks=blocks)
    except Exception as exc:
        error = _failure(exc)
        with transaction.atomic():
            locked = SlackMessage.objects.select_for_update().get(pk=message_id)
            locked.update_attempts += 1
            locked.last_error = error
            if locked.update_attempts < app_settings.NOTIFICATION_MAX_ATTEMPTS:
                queue_update(
                    message_id,
                    run_after=timezone.now() + notifications.backoff(locked.update_attempts),
                )
                outcome = "will retry"
            else:
                outcome = "gave up"
                log.warning("Slack message %s: its update given up: %s", message_id, error)
            locked.save(update_fields=["update_attempts", "last_error"])
        return outcome
    SlackMessage.objects.filter(pk=message_id).update(shown=shown, update_attempts=0, last_error="")
    return "updated"


STUCK_AFTER = timedelta(minutes=10)


def requeue_stuck() -> int:
    """Queue again the pending messages whose task never came; how many."""
    with transaction.atomic():
        rows = list(
            SlackMessage.objects.select_for_update(skip_locked=True).filter(
                state=PENDING, next_attempt_at__lt=timezone.now() - STUCK_AFTER
            )[:100]
        )
        for row in rows:
            row.next_attempt_at = timezone.now()
            row.save(update_fields=["next_attempt_at"])
            transaction.on_commit(lambda pk=row.pk: _queue_post(pk))
    return len(rows)


def maintain() -> tuple[int, int]:
    """The delivery worker's turn: (messages made, messages re-queued)."""
    if not enabled():
        return 0, 0
    return dispatch(), requeue_stuck()
