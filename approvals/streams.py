"""`/api/events`: host events as server-sent events, resumable with Last-Event-ID.

The stream polls the audit trail (`event_feed`) every TOOLNEXUS_EVENTS_POLL_SECONDS, so it
hears the worker's changes from any process, and re-checks the caller's access on every
poll: an account deactivated, a token revoked or an agent hidden since stops what the caller
hears at the next poll, as the live sockets do. It ends after TOOLNEXUS_EVENTS_STREAM_SECONDS
(the server would cut it at its HTTP timeout); the client reconnects with the last id it got
and loses nothing (EventSource does that by itself, after the `retry` it was given).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from channels.db import database_sync_to_async
from django.utils import timezone

from . import event_feed, permissions
from .conf import app_settings
from .domain import hostevents
from .models import ApiToken

RETRY_MS = 2000  # what a reconnecting EventSource waits
BATCH = 100


def _frame(event: Any) -> str:
    body = {"id": hostevents.event_id(event), **hostevents.payload(event)}
    data = json.dumps(body, separators=(",", ":"))
    return f"id: {body['id']}\nevent: {body['type']}\ndata: {data}\n\n"


def _access(user: Any, token_pk: int | None) -> frozenset[str] | None:
    """The agents hidden from the caller now, or None when the caller may no longer read."""
    user.refresh_from_db(fields=["is_active"])
    if not user.is_active:
        return None
    if token_pk is not None:
        token = ApiToken.objects.filter(pk=token_pk).first()
        if token is None or token.state_at(timezone.now()) != "active":
            return None
    permissions.agent_rights(user, fresh=True)
    if not user.has_perm(permissions.VIEW_RUNS):
        return None
    return permissions.hidden_agents(user)


async def host_event_stream(
    *, user: Any, token_pk: int | None, after: int, types: list[str] | None
) -> AsyncIterator[str]:
    """The stream's text, from the events after audit row `after`."""
    yield f"retry: {RETRY_MS}\n\n"
    now = time.monotonic
    ends = now() + app_settings.EVENTS_STREAM_SECONDS
    quiet_since = now()
    cursor = after
    while now() < ends:
        hidden = await database_sync_to_async(_access)(user, token_pk)
        if hidden is None:
            yield 'event: closed\ndata: {"detail":"your access to events ended"}\n\n'
            return
        rows, cursor = await database_sync_to_async(event_feed.host_events_after)(
            cursor, types=types, hidden=hidden, limit=BATCH
        )
        for row in rows:
            yield _frame(row)
        if rows:
            quiet_since = now()
        elif now() - quiet_since >= app_settings.EVENTS_KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            quiet_since = now()
        if len(rows) < BATCH:
            await asyncio.sleep(max(0.0, min(app_settings.EVENTS_POLL_SECONDS, ends - now())))
