"""Changes to runs and requests, announced once their transaction commits.

Writes (services, the worker) call `announce` inside their transaction; receivers (the live
layer) hear `changed` after the commit, never for a rolled-back change. Nothing below the live
layer knows who listens. A process whose event loop is about to end awaits `settle()`, so
announcements its receivers still hold (queued to send) are delivered first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import transaction
from django.dispatch import Signal

# Sent after commit with: run_id, request_pk (or None), created (a new request), row (the
# request row as the write left it in memory, which saves receivers a read, or None), and
# status_only (only the run's status and worker changed: its transcript and requests did not).
changed = Signal()

# Sent at once (nothing is written: no transaction to wait for) while a model reply is
# generated, with: run_id, text (the turn's reply so far) and done (the turn ended; the stored
# transcript takes over). Receivers must not block: it is sent on the run's event loop.
replied = Signal()
# Sent after the last commit of a bulk decision (`bulk_decision`) with: bulk (its id, which
# its requests' `changed` carried), user_id, username, verb ("approved", "declined") and
# requests, the (pk, agent) of each request it decided.
bulk_decided = Signal()

# The bulk decision being made in this context (its id), or None.
_bulk: ContextVar[str | None] = ContextVar("approvals_bulk", default=None)

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
    bulk = _bulk.get()
    transaction.on_commit(
        lambda: changed.send(
            sender=None,
            run_id=run_id,
            request_pk=request_pk,
            created=created,
            row=row,
            status_only=status_only,
            bulk=bulk,
        ),
        robust=True,
    )


# Sent after commit with: user_ids, text, about: a note for some people's live pages (an
# escalation's toast), said once, not a change of any page's content.
notified = Signal()


def notify(*, user_ids: list[int], text: str, about: str = "") -> None:
    transaction.on_commit(
        lambda: notified.send(sender=None, user_ids=list(user_ids), text=text, about=about),
        robust=True,
    )


@contextmanager
def bulk_decision(*, user_id: Any, username: str, verb: str) -> Iterator[list[tuple[int, str]]]:
    """Announcements made inside carry this bulk decision's id (`changed`'s `bulk`), so that
    pages say it once, as a whole: `bulk_decided` follows, with what the caller appended to
    the list it gets (the pk and agent of each request decided)."""
    bulk_id = uuid.uuid4().hex
    token = _bulk.set(bulk_id)
    decided: list[tuple[int, str]] = []
    try:
        yield decided
    finally:
        _bulk.reset(token)
        if decided:
            transaction.on_commit(
                lambda: bulk_decided.send(
                    sender=None,
                    bulk=bulk_id,
                    user_id=user_id,
                    username=username,
                    verb=verb,
                    requests=list(decided),
                ),
                robust=True,
            )


async def settle(timeout: float = 5.0) -> None:
    """Let receivers deliver what they still hold on the running loop (a worker's or a
    server's last step). A receiver's failure is theirs to log; this never raises for it."""
    await settling.asend_robust(sender=None, timeout=timeout)


def reply_streamed(*, run_id: int, text: str, done: bool, agent: str = "") -> None:
    """Tell whoever listens that run `run_id`'s model reply reads `text` so far (`agent`: in
    a team run, the agent replying)."""
    replied.send_robust(sender=None, run_id=run_id, text=text, done=done, agent=agent)
