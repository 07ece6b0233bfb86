"""What refused input must leave alone: every row that a write could touch."""

from __future__ import annotations

from typing import Any

from django_tasks_db.models import DBTaskResult

from approvals.models import ApprovalRequest, Event, RequestCall, Run, ToolExecution


def snapshot() -> dict[str, Any]:
    """The stored state of runs, requests, calls, events, executions and tasks (every write
    bumps a run's `updated_at` or `version`, or a request's state)."""
    return {
        "runs": list(
            Run.objects.order_by("pk").values_list(
                "pk",
                "agent",
                "prompt",
                "status",
                "version",
                "error",
                "text",
                "messages",
                "attempts",
                "updated_at",
            )
        ),
        "requests": list(
            ApprovalRequest.objects.order_by("pk").values_list(
                "pk", "state", "reason", "answer", "decided_by_id", "decided_at", "applied_at"
            )
        ),
        "calls": list(
            RequestCall.objects.order_by("pk").values_list(
                "pk", "decision", "edited_input", "output", "is_error", "reason"
            )
        ),
        "events": list(Event.objects.order_by("pk").values_list("pk", "action")),
        "executions": ToolExecution.objects.count(),
        "tasks": DBTaskResult.objects.count(),
    }
