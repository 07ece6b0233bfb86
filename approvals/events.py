"""Changes to runs and requests, announced once their transaction commits.

Writes (services, the worker) call `announce` inside their transaction; receivers (the live
layer) hear `changed` after the commit, never for a rolled-back change. Nothing below the live
layer knows who listens. A process whose event loop is about to end awaits `settle()`, so
announcements its receivers still hold (queued to send) are delivered first.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import Signal

# Sent after commit with: run_id, request_pk (or None), created (a new request), row (the
# request row as the write left it in memory, which saves receivers a read, or None), and
# status_only (only the run's status and worker changed: its transcript and requests did not).
changed = Signal()

# Sent (with `asend`) before a process's event loop ends: receivers holding announcements to
# deliver on that loop deliver them, within `timeout` seconds.
settling = Signal()


def announce(
    *,
    run_id: int,
    request_pk: int | None = None,
    created: bool = False,
    row: Any = None,
    status_only: bool = False,
) -> None:
    transaction.on_commit(
        lambda: changed.send(
            sender=None,
            run_id=run_id,
            request_pk=request_pk,
            created=created,
            row=row,
            status_only=status_only,
        ),
        robust=True,
    )


async def settle(timeout: float = 5.0) -> None:
    """Let receivers deliver what they still hold on the running loop (a worker's or a
    server's last step). A receiver's failure is theirs to log; this never raises for it."""
    await settling.asend_robust(sender=None, timeout=timeout)
