"""Changes to runs and requests, announced once their transaction commits.

Writes (services, the worker) call `announce` inside their transaction; receivers (the live
layer) hear `changed` after the commit, never for a rolled-back change. Nothing below the live
layer knows who listens.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import Signal

# Sent after commit with: run_id, request_pk (or None), created (a new request), row (the
# request row as the write left it in memory, which saves receivers a read, or None), and
# status_only (only the run's status and worker changed: its transcript and requests did not).
changed = Signal()


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
