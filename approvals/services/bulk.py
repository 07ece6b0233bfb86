"""Bulk decisions from the triage inbox: approve or decline many requests at once.

Each request is decided by the single-request service (`request_approve` /
`request_decline`) in its own transaction, so one refusal never undoes the others and every
decision is recorded, audited, announced and resumed exactly like one made on its card.
The outcome of each id, in the order given:

- "done": decided now.
- "partial": an approval counted toward the N distinct approvers a rule requires
  ("1 of 2 approved: rita"); the request stays pending for the others.
- "already": someone decided it first (the message names who and when).
- "invalid": bulk approve does not fit it (see below), another reviewer holds a claim on
  it, or the service refused the input.
- "forbidden": the user may not decide it (the agent's groups, the starter rule).
- "missing": no such request, or one of an agent hidden from the user.

Bulk approve accepts only what approving "as shown" fully decides:

- an approval-gated tool call (kind "approval"): runs with the arguments the model gave,
  unless its prompt says it cannot be undone (IRREVERSIBLE): such a call is approved on its
  card, where the reviewer confirms it, so bulk approve leaves it "invalid";
- a relay turn (kind "tool_call") whose every call has an executor on the host: all its
  calls are approved and run. A turn with any call lacking an executor needs a typed
  result, so it is "invalid" (decide it on its card, or decline it).

Questions, input requests, MCP questions (elicitation), sign-ins and a host's own kinds
need a typed answer or a consent the reviewer gives on the card: "invalid" for bulk
approve. Bulk decline accepts every kind, with one reason for all.

A request another reviewer has claimed (an active claim) is left undecided, "invalid" with
"claimed by <name>: open it to take it over": taking over a claim is done on the card, one
request at a time. The user's own claims and lapsed claims hold nothing back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .. import agents, events
from ..domain.exceptions import AlreadyDecided, InvalidInput, NotAllowed, ServiceError
from ..models import ApprovalRequest
from ..permissions import DECIDE_PERMISSION, agent_rights, require
from ..selectors import active_claim
from .requests import request_approve, request_decline

MAX_BULK_IDS = 500
# An approval whose prompt says it cannot be undone is confirmed one by one, never in bulk
# (the same words the card's confirmation step looks for, presenters.cards.IRREVERSIBLE).
IRREVERSIBLE = re.compile(
    r"\b(cannot|can't|can not|won't be able to) be (undone|reversed|recovered)\b|\birreversibl",
    re.IGNORECASE,
)
ACTIONS = ("approve", "decline")
BULK_APPROVE_KINDS = ("approval", "tool_call")

DONE = "done"
ALREADY = "already"
INVALID = "invalid"
FORBIDDEN = "forbidden"
MISSING = "missing"
PARTIAL = "partial"


@dataclass(frozen=True)
class BulkOutcome:
    request_id: str
    status: str  # done | partial | already | invalid | forbidden | missing
    message: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"id": self.request_id, "status": self.status, "message": self.message}


def _clean_ids(request_ids: Iterable[Any]) -> list[str]:
    if isinstance(request_ids, (str, bytes)) or request_ids is None:
        raise InvalidInput("ids: must be a list of request ids")
    ids: list[str] = []
    seen: set[str] = set()
    for i, value in enumerate(request_ids):
        if not isinstance(value, str) or not value or "\x00" in value:
            raise InvalidInput(f"ids[{i}]: must be a request id (a non-empty string)")
        if value not in seen:
            seen.add(value)
            ids.append(value)
    if not ids:
        raise InvalidInput("ids: give at least one request id")
    if len(ids) > MAX_BULK_IDS:
        raise InvalidInput(f"ids: at most {MAX_BULK_IDS} requests at once (got {len(ids)})")
    return ids


def _approve_problem(row: ApprovalRequest) -> str:
    """Why bulk approve cannot decide this pending request ("" if it can)."""
    label = ApprovalRequest.Kind(row.kind).label if row.kind in ApprovalRequest.Kind else row.kind
    if row.kind not in BULK_APPROVE_KINDS:
        return f"a {label} needs an answer typed on its card; bulk approve does not answer it"
    if row.kind == "approval" and IRREVERSIBLE.search(row.prompt or ""):
        return "it cannot be undone: approve it on its card, where you confirm it"
    if row.kind == "tool_call":
        agent = agents.get(row.agent)
        names = [c.tool_name for c in row.calls.all()]
        if not names:
            return "this relay request carries no calls"
        missing = [n for n in names if agent is None or agent.executor_for(n) is None]
        if missing:
            return (
                f"{', '.join(sorted(set(missing)))} has no executor here: type its result"
                " on the card, or decline"
            )
    return ""


def requests_bulk(
    *, request_ids: Iterable[Any], user: Any, action: str, reason: str = ""
) -> list[BulkOutcome]:
    """Approve or decline each request (at most 500), each in its own transaction through
    the single-request services; one BulkOutcome per distinct id, in the order given."""
    if action not in ACTIONS:
        raise InvalidInput("action: must be approve or decline")
    ids = _clean_ids(request_ids)
    require(user, DECIDE_PERMISSION, "decide requests")
    rows = {
        r.request_id: r
        for r in ApprovalRequest.objects.filter(request_id__in=ids)
        .only(
            "pk",
            "request_id",
            "kind",
            "agent",
            "state",
            "run_id",
            "prompt",
            "claimed_at",
            "claimed_by",
        )
        .select_related("claimed_by")
        .prefetch_related("calls")
    }
    rights = agent_rights(user)
    outcomes: list[BulkOutcome] = []
    verb = "approved" if action == "approve" else "declined"
    # Pages say the decision once, as a whole, not once per request it decided.
    with events.bulk_decision(user_id=user.pk, username=user.get_username(), verb=verb) as done:
        for request_id in ids:
            outcome = _one(request_id, rows.get(request_id), user, rights, action, reason)
            outcomes.append(outcome)
            if outcome.status == DONE:
                done.append((rows[request_id].pk, rows[request_id].agent))
    return outcomes


def _one(
    request_id: str, row: ApprovalRequest | None, user: Any, rights: Any, action: str, reason: str
) -> BulkOutcome:
    """One request of a bulk decision: decided, or why not."""
    if row is None or not rights.can_view(row.agent):
        # Before anything else is said of it: a hidden agent's request reads as missing.
        return BulkOutcome(request_id, MISSING, "no such request")
    holder = active_claim(row)
    if holder is not None and holder.pk != user.pk:
        # Taking over another reviewer's claim is asked for one request at a time.
        return BulkOutcome(
            request_id, INVALID, f"claimed by {holder.get_username()}: open it to take it over"
        )
    if action == "approve" and row.state == ApprovalRequest.State.PENDING:
        problem = _approve_problem(row)
        if problem:
            return BulkOutcome(request_id, INVALID, problem)
    return _decide_one(request_id, user, action, reason)


def _decide_one(request_id: str, user: Any, action: str, reason: str) -> BulkOutcome:
    partial = None
    try:
        if action == "approve":
            row = request_approve(request_id=request_id, user=user)
            partial = getattr(row, "partial_approval", None)
        else:
            request_decline(request_id=request_id, user=user, reason=reason)
    except ApprovalRequest.DoesNotExist:  # gone, or an agent hidden from the user
        return BulkOutcome(request_id, MISSING, "no such request")
    except AlreadyDecided as exc:
        return BulkOutcome(request_id, ALREADY, str(exc))
    except NotAllowed as exc:
        return BulkOutcome(request_id, FORBIDDEN, str(exc))
    except InvalidInput as exc:
        return BulkOutcome(request_id, INVALID, str(exc))
    except ServiceError as exc:
        return BulkOutcome(request_id, INVALID, str(exc))
    if partial is not None:  # counted toward the approvals a rule requires; still pending
        return BulkOutcome(request_id, PARTIAL, partial.message)
    return BulkOutcome(request_id, DONE, "approved" if action == "approve" else "declined")
