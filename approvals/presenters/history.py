"""A request's audit trail as lines a reviewer reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..domain.records import MCP_SERVER_TOLD
from .cards import Outcome
from .timeline import told_text

HISTORY_LABELS = {
    "run_halted": "The run halted on this request",
    "request_created": "Request created",
    "request_approved": "Approved",
    "request_answered": "Answered",
    "request_declined": "Declined",
    "request_expired": "Expired",
    "request_cancelled": "Cancelled",
    "run_resumed": "The run was queued to resume with the decision",
    "run_cancelled": "The run was cancelled",
    "run_followed_up": "Follow-up sent",
    "claimed": "Claimed",
    "released": "Claim released",
    "claim taken over": "Claim taken over",
}


@dataclass
class HistoryEntry:
    at: datetime
    label: str
    actor: str
    reason: str = ""


def history(events: Sequence[Any], outcome: Outcome | None = None) -> list[HistoryEntry]:
    """Audit events of one request as lines a reviewer reads; the decision's own line says
    what the record says of it ("Approved with edits", "Decided per call")."""
    out = []
    for e in events:
        label = HISTORY_LABELS.get(e.action, e.action.replace("_", " ").capitalize())
        if outcome is not None and e.action == f"request_{e.to_state}" and e.from_state:
            label = outcome.verb
        actor = e.actor.get_username() if e.actor_id and e.actor else ""
        rule = (e.detail or {}).get("rule")
        if isinstance(rule, dict):  # decided by a rule: named as it was then
            actor = f"rule {rule.get('id')}, {rule.get('name')}, version {rule.get('version')}"
        reason = ""
        if e.action in ("request_declined", "request_cancelled", "run_cancelled"):
            reason = str((e.detail or {}).get("reason") or "")
        if e.action == MCP_SERVER_TOLD:  # the action and the tool's result, not the key
            label = told_text(e.detail or {})
        out.append(HistoryEntry(e.created_at, label, actor, reason))
    return out
