"""What a host hears: the audit trail's changes that matter outside the app, as events.

The audit trail (`Event` rows, written in the same transaction as each change) is the
outbox: a host event is one of its rows, its id `evt_<row id>` stable for every delivery and
every reconnect. Both the event stream (`/api/events`) and webhooks read it; nothing on the
decision path writes anything more for them.
"""

from __future__ import annotations

from typing import Any

from ..models import Event
from .teams import chain_of, handle_of

REQUEST_CREATED = "request.created"
REQUEST_DECIDED = "request.decided"
RUN_PENDING = "run.pending"
RUN_FINISHED = "run.finished"
RUN_FAILED = "run.failed"
RUN_CANCELLED = "run.cancelled"

# The audit actions each event type is made of.
ACTIONS: dict[str, tuple[str, ...]] = {
    REQUEST_CREATED: ("request_created",),
    REQUEST_DECIDED: (
        "request_approved",
        "request_answered",
        "request_declined",
        "request_expired",
        "request_cancelled",
    ),
    RUN_PENDING: ("run_halted",),
    RUN_FINISHED: ("run_done", "run_incomplete"),
    RUN_FAILED: ("run_failed",),
    RUN_CANCELLED: ("run_cancelled",),
}
TYPES: tuple[str, ...] = tuple(ACTIONS)
TYPE_OF_ACTION: dict[str, str] = {
    action: event_type for event_type, actions in ACTIONS.items() for action in actions
}


def event_id(event: Event) -> str:
    return f"evt_{event.pk}"


def parse_event_id(value: str | None) -> int | None:
    """The audit row id of `evt_<id>` (or a bare id), None for nothing or nonsense."""
    if not value:
        return None
    text = value.strip().removeprefix("evt_")
    return int(text) if text.isdigit() and len(text) <= 18 else None


def actions_of(types: list[str] | None) -> list[str]:
    chosen = types or list(TYPES)
    return [action for event_type in chosen for action in ACTIONS[event_type]]


def unknown_types(types: list[str]) -> list[str]:
    return [t for t in types if t not in ACTIONS]


def _decided_by(event: Event) -> dict[str, Any] | None:
    if event.actor_id is not None:
        return {"type": "person", "username": event.actor.get_username()}
    rule = event.detail.get("rule") if isinstance(event.detail, dict) else None
    if rule:
        return {"type": "rule", "rule": rule}
    return {"type": "system"}


def _request_path(event: Event) -> Any:
    """The request's `data.path`: annotated by `event_feed` (its data stays deferred there),
    else read from the request (one event: the admin's body, a webhook's attempt)."""
    if hasattr(event, "request_path"):
        return event.request_path
    data = event.request.data
    return data.get("path") if isinstance(data, dict) else None


def payload(event: Event) -> dict[str, Any]:
    """The event as the host receives it (Standard Webhooks' `type`, `timestamp`, `data`).
    `event` comes with `run`, `request` and `actor` loaded (`event_feed`). Argument values
    stay out: the host reads a request or run through the API when it needs them."""
    event_type = TYPE_OF_ACTION[event.action]
    detail = event.detail if isinstance(event.detail, dict) else {}
    run = event.run
    data: dict[str, Any] = {
        "run_id": run.pk,
        "agent": run.agent,
    }
    if event.request_id is not None:
        request = event.request
        data.update(request_id=request.request_id, kind=request.kind)
        # For a team run: the agents the request climbed through, and the asking handle.
        where = {"path": _request_path(event)}
        data.update(chain=chain_of(where), handle=handle_of(where) or None)
    if event_type == REQUEST_DECIDED:
        data.update(
            state=event.to_state,
            decided_by=_decided_by(event),
            reason=detail.get("reason", ""),
        )
    elif event_type == RUN_PENDING:
        data.update(request_id=detail.get("request_id"), kind=detail.get("kind"))
    elif event_type == RUN_FAILED:
        data.update(error=detail.get("error", ""))
    elif event_type == RUN_CANCELLED:
        data.update(reason=detail.get("reason", ""))
    if event.action.startswith("run_"):
        data["run_status"] = event.to_state
    return {
        "type": event_type,
        "timestamp": event.created_at.isoformat().replace("+00:00", "Z"),
        "data": data,
    }
