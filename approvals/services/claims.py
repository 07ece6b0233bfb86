"""Triage writes: claims ("I am on it") and each reviewer's own snooze / ignore.

A claim is advisory: it tells other reviewers someone is working on a request (the inbox
shows it, `claim=unclaimed` leaves it out) and lapses after TOOLNEXUS_CLAIM_MINUTES (0: it
lasts until released or the request is decided). Deciding does not check claims; a decided
request keeps its claim fields as history. Claim, release and take-over each write an audit
`Event` ("claimed", "released", "claim taken over") and announce the change to live pages.

Hiding (snooze until a time, ignore until un-hidden) is per reviewer: nobody else's inbox
changes, and it writes no audit event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import events
from ..domain.exceptions import ClaimedByOther, InvalidInput
from ..models import ApprovalRequest, Event, RequestHide
from ..permissions import (
    DECIDE_PERMISSION,
    VIEW_REQUESTS,
    require,
    require_visible,
)
from ..selectors import active_claim
from .requests import lock_for_decision

CLAIMED = "claimed"
RELEASED = "released"
TAKEN_OVER = "claim taken over"


def _lock_pending(user: Any, request_id: str) -> ApprovalRequest:
    """The pending request under a row lock, if `user` may decide it. Declining is enough:
    a starter who may not approve may still claim."""
    return lock_for_decision(user, request_id, approving=False)


def _event(row: ApprovalRequest, user: Any, action: str, **detail: Any) -> None:
    Event.objects.create(
        run_id=row.run_id,
        request=row,
        actor=user if getattr(user, "is_authenticated", False) else None,
        action=action,
        detail={"request_id": row.request_id, **detail},
    )


def request_claim(*, request_id: str, user: Any, takeover: bool = False) -> ApprovalRequest:
    """Claim a pending request for `user`. Their own active claim is refreshed (its time
    restarts); another reviewer's active claim is ClaimedByOther (409, naming them) unless
    `takeover`. A lapsed claim is simply replaced."""
    require(user, DECIDE_PERMISSION, "claim requests")
    with transaction.atomic():
        row = _lock_pending(user, request_id)
        now = timezone.now()
        holder = active_claim(row, now=now)  # claimed_by read after the lock: current
        if holder is not None and holder.pk != user.pk and not takeover:
            raise ClaimedByOther(
                request_id=row.request_id,
                claimed_by=holder.get_username(),
                claimed_at=row.claimed_at,
            )
        if holder is None:
            _event(row, user, CLAIMED)
        elif holder.pk != user.pk:
            _event(row, user, TAKEN_OVER, previous=holder.get_username())
        row.claimed_by, row.claimed_at = user, now
        row.save(update_fields=["claimed_by", "claimed_at"])
        events.announce(run_id=row.run_id, request_pk=row.pk)
    return row


def request_release(*, request_id: str, user: Any) -> ApprovalRequest:
    """Give up one's own claim. Releasing a request nobody holds changes nothing; another
    reviewer's active claim is ClaimedByOther (409): only its holder releases it (anyone
    else may take it over)."""
    require(user, DECIDE_PERMISSION, "release claims")
    with transaction.atomic():
        row = _lock_pending(user, request_id)
        holder = active_claim(row)
        if holder is None:
            return row
        if holder.pk != user.pk:
            raise ClaimedByOther(
                request_id=row.request_id,
                claimed_by=holder.get_username(),
                claimed_at=row.claimed_at,
            )
        row.claimed_by, row.claimed_at = None, None
        row.save(update_fields=["claimed_by", "claimed_at"])
        _event(row, user, RELEASED)
        events.announce(run_id=row.run_id, request_pk=row.pk)
    return row


def _visible_request(user: Any, request_id: str) -> ApprovalRequest:
    require(user, VIEW_REQUESTS, "view requests")
    row = ApprovalRequest.objects.only("pk", "agent", "run_id", "request_id", "state").get(
        request_id=request_id
    )
    require_visible(user, row)
    return row


def request_hide(*, request_id: str, user: Any, until: datetime | None = None) -> RequestHide:
    """Hide a request from `user`'s own inbox: snoozed until `until` (a time in the future),
    or ignored (`until` None) until they un-hide it. Hiding it again replaces the old end."""
    row = _visible_request(user, request_id)
    if until is not None:
        if timezone.is_naive(until):
            raise InvalidInput("until: give a time zone (e.g. 2026-12-01T09:00:00Z)")
        if until <= timezone.now():
            raise InvalidInput("until: must be in the future")
    with transaction.atomic():
        hide, _ = RequestHide.objects.update_or_create(
            request=row, user=user, defaults={"until": until}
        )
        events.announce(run_id=row.run_id, request_pk=row.pk)
    return hide


def request_unhide(*, request_id: str, user: Any) -> None:
    """Show a snoozed or ignored request in `user`'s inbox again (nothing hidden: no-op)."""
    row = _visible_request(user, request_id)
    with transaction.atomic():
        deleted, _ = RequestHide.objects.filter(request=row, user=user).delete()
        if deleted:
            events.announce(run_id=row.run_id, request_pk=row.pk)
