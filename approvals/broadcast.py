"""Live push: the one module that knows the channel groups. Called after commit."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

INBOX_GROUP = "approvals.inbox"


def run_group(run_id: int) -> str:
    return f"approvals.run.{run_id}"


def changed(*, run_id: int, request_pk: int | None = None) -> None:
    """Tell every open inbox and the run's page that something changed.

    Pages re-render from the database on what they receive, so a lost message costs a
    stale view until the next event or reconnect, never a lost request.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "approvals.changed", "run_id": run_id, "request_pk": request_pk}
    try:
        async_to_sync(_send)(layer, message, run_id)
    except Exception:  # a push failure must never undo or fail a committed decision
        log.exception("live push for run %s failed", run_id)


async def _send(layer, message: dict, run_id: int) -> None:
    await layer.group_send(INBOX_GROUP, message)
    await layer.group_send(run_group(run_id), message)
