"""The journal of real tool executions, by (transcript position, call id): a tool that ran is
never run again after a crash, and one a worker died in is reported, not re-run."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from ..models import ToolExecution


def execution_begin(
    *, run_id: int, message_index: int, call_id: str, tool_name: str, input: dict[str, Any]
) -> ToolExecution | None:
    """Record that a tool is about to run; returns the earlier record if there is one."""
    with transaction.atomic():
        key = {"run_id": run_id, "message_index": message_index, "call_id": call_id}
        existing = ToolExecution.objects.select_for_update().filter(**key).first()
        if existing is not None:
            return existing
        ToolExecution.objects.create(**key, tool_name=tool_name, input=input)
    return None


def execution_finish(
    *, run_id: int, message_index: int, call_id: str, output: str, is_error: bool
) -> None:
    ToolExecution.objects.filter(
        run_id=run_id, message_index=message_index, call_id=call_id
    ).update(output=output, is_error=is_error, finished_at=timezone.now())


def execution_discard(*, run_id: int, message_index: int, call_id: str) -> None:
    """The tool suspended instead of running: nothing happened, so nothing to remember."""
    ToolExecution.objects.filter(
        run_id=run_id, message_index=message_index, call_id=call_id, finished_at__isnull=True
    ).delete()
