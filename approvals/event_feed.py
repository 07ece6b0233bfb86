"""Reads of the host events (`domain.hostevents`): the audit rows after a given one.

An audit row becomes readable here `settle` seconds after it was written. Ids are handed out
at insert and a transaction may commit after a later one has: a reader that skipped past a
row still uncommitted would never see it. The app's writes commit within milliseconds of
their inserts, so a short settle closes that gap (TOOLNEXUS_EVENTS_SETTLE_SECONDS).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta

from django.db.models import Max
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from .conf import app_settings
from .domain import hostevents
from .models import Event


def latest_event_id() -> int:
    """The newest audit row's id (0 for none): where a new reader or subscription starts."""
    return Event.objects.aggregate(latest=Max("pk"))["latest"] or 0


def host_events_after(
    after: int,
    *,
    types: list[str] | None = None,
    hidden: Collection[str] = (),
    limit: int = 100,
) -> tuple[list[Event], int]:
    """Up to `limit` host events after audit row `after`, oldest first, with their run,
    request and actor loaded (none of an agent in `hidden`), and the cursor to read from next:
    past every settled audit row when fewer than `limit` came, so the next read does not walk
    the other actions' rows again."""
    settled = timezone.now() - timedelta(seconds=app_settings.EVENTS_SETTLE_SECONDS)
    through = (
        Event.objects.filter(pk__gt=after, created_at__lte=settled).aggregate(latest=Max("pk"))[
            "latest"
        ]
        or after
    )
    rows = (
        Event.objects.filter(pk__gt=after, pk__lte=through, action__in=hostevents.actions_of(types))
        .select_related("run", "request", "actor")
        .defer(*_LARGE_FIELDS)
        # The request's place in a team run's chain, without reading its (deferred) data.
        .annotate(request_path=KeyTransform("path", "request__data"))
        .order_by("pk")
    )
    if hidden:
        rows = rows.exclude(run__agent__in=list(hidden))
    found = list(rows[:limit])
    return found, (found[-1].pk if len(found) == limit else through)


# What an event's payload never reads: transcripts and texts, kept off the wire.
_LARGE_FIELDS = (
    "run__messages",
    "run__system_prompt",
    "run__prompt",
    "run__text",
    "run__usage",
    "run__error",
    "request__data",
    "request__prompt",
    "request__search_text",
    "request__answer",
    "request__reason",
    "request__url",
)
