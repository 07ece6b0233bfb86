"""The journal of real tool executions, by (handle, transcript position, call id): a tool that
ran is never run again after a crash, and one a worker died in is reported, not re-run.

`handle` is "" for a single agent's run; in a team run it names the agent's handle
("root/coordinator.1/refunds.1"), whose own transcript the position and call id are of."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ..domain import statements
from ..domain.jsonvalues import cut_deep
from ..models import RequestCall, ToolExecution


def execution_begin(
    *,
    run_id: int,
    message_index: int,
    call_id: str,
    tool_name: str,
    input: dict[str, Any],
    handle: str = "",
) -> ToolExecution | None:
    """Record that a tool is about to run; returns the earlier record if there is one.

    One INSERT, committed on its own outside a transaction: the key's unique constraint is
    what keeps a second record out (a worker that finds one reads it instead)."""
    key = {"run_id": run_id, "handle": handle, "message_index": message_index, "call_id": call_id}
    try:
        # Inside a transaction, a savepoint keeps a conflict from breaking it.
        with transaction.atomic() if connection.in_atomic_block else nullcontext():
            # A record, kept within the JSON columns' depth (the tool gets the whole value).
            shown = cut_deep(input)[0]
            statements.insert([ToolExecution(**key, tool_name=tool_name, input=shown)])
        return None
    except IntegrityError:
        earlier = ToolExecution.objects.filter(**key).first()
        if earlier is None:
            raise  # not the key's constraint (the run is gone)
        return earlier


def execution_finish(
    *,
    run_id: int,
    message_index: int,
    call_id: str,
    output: str,
    is_error: bool,
    request_call_pk: int | None = None,
    then: Callable[[], None] | None = None,
    handle: str = "",
) -> None:
    """Record a tool's result; `request_call_pk`: a decided relay call's row, which gets the
    result in the same transaction; `then`: a further write for that transaction (the
    relay answer built from this last result)."""

    def finish() -> None:
        statements.update(
            ToolExecution,
            {
                "run_id": run_id,
                "handle": handle,
                "message_index": message_index,
                "call_id": call_id,
            },
            {"output": output, "is_error": is_error, "finished_at": timezone.now()},
        )

    if request_call_pk is None and then is None:
        finish()
        return
    with transaction.atomic():
        finish()
        if request_call_pk is not None:
            statements.update(
                RequestCall, {"pk": request_call_pk}, {"output": output, "is_error": is_error}
            )
        if then is not None:
            then()


def execution_discard(*, run_id: int, message_index: int, call_id: str, handle: str = "") -> None:
    """The tool suspended instead of running: nothing happened, so nothing to remember."""
    ToolExecution.objects.filter(
        run_id=run_id,
        handle=handle,
        message_index=message_index,
        call_id=call_id,
        finished_at__isnull=True,
    ).delete()
