"""The state machine of runs and requests and the writes every change of state makes.

Callers hold the transaction: each function here expects to run inside `transaction.atomic`
with its rows locked. A change appends an audit `Event`, and announces itself to live pages
once the transaction commits (`approvals.events`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from toolnexus import Answer, Request
from toolnexus.relay import decline_text, relay_calls_of

from .. import events, metrics
from ..conf import app_settings
from ..models import ApprovalRequest, Event, RequestCall, Run
from . import statements
from .exceptions import AlreadyDecided, InvalidTransition
from .jsonvalues import cut_deep

RunStatus = Run.Status
State = ApprovalRequest.State

ALLOWED_TRANSITIONS: dict[str, dict[str, set[str]]] = {
    "run": {
        RunStatus.QUEUED: {RunStatus.RUNNING, RunStatus.CANCELLED},
        RunStatus.RUNNING: {
            RunStatus.PENDING,
            RunStatus.DONE,
            RunStatus.INCOMPLETE,
            RunStatus.FAILED,
            RunStatus.QUEUED,  # recovered after its worker died
            RunStatus.CANCELLED,
        },
        RunStatus.PENDING: {RunStatus.QUEUED, RunStatus.CANCELLED},
        RunStatus.FAILED: {RunStatus.QUEUED, RunStatus.CANCELLED},
        # A finished run takes a follow-up (a new user message): it runs again.
        RunStatus.INCOMPLETE: {RunStatus.QUEUED},
        RunStatus.DONE: {RunStatus.QUEUED},
        RunStatus.CANCELLED: set(),
    },
    "request": {
        State.PENDING: {
            State.APPROVED,
            State.ANSWERED,
            State.DECLINED,
            State.EXPIRED,
            State.CANCELLED,
        },
        State.APPROVED: set(),
        State.ANSWERED: set(),
        State.DECLINED: set(),
        State.EXPIRED: set(),
        State.CANCELLED: set(),
    },
}


DEFAULT_REASON = "declined"  # what the model reads for a refusal without a reason
# The audit action of telling an MCP server how its question ended when its run will not
# resume (`execution.elicitations`); its detail: server, told (the action), output, is_error.
MCP_SERVER_TOLD = "mcp_server_told"


def check_transition(entity: str, current: str, new: str) -> None:
    if new not in ALLOWED_TRANSITIONS[entity].get(current, set()):
        raise InvalidTransition(f"a {entity} cannot go from {current} to {new}")


def append_event(
    run: Run,
    action: str,
    *,
    request: ApprovalRequest | None = None,
    actor: Any = None,
    from_state: str = "",
    to_state: str = "",
    into: list[Event] | None = None,
    **detail: Any,
) -> None:
    """Append an audit event; with `into`, collect it unsaved for one bulk insert."""
    event = Event(
        run=run,
        request=request,
        actor=actor if actor is not None and getattr(actor, "is_authenticated", False) else None,
        action=action,
        from_state=from_state,
        to_state=to_state,
        detail=detail,
    )
    if into is None:
        event.save()
    else:
        into.append(event)


def set_run_status(
    run: Run,
    new: str,
    *,
    actor: Any = None,
    action: str,
    into: list[Event] | None = None,
    **detail: Any,
) -> None:
    old = run.status
    check_transition("run", old, new)
    run.status = new
    run.version += 1
    append_event(run, action, actor=actor, from_state=old, to_state=new, into=into, **detail)


def _expiry_of(request: Request) -> datetime | None:
    if request.expires_at:
        return parse_datetime(request.expires_at.replace("Z", "+00:00").replace("z", "+00:00"))
    ttl = int(app_settings.REQUEST_TTL_SECONDS or 0)
    return timezone.now() + timedelta(seconds=ttl) if ttl > 0 else None


def create_request(run: Run, request: Request) -> ApprovalRequest:
    # What the model sent is kept within MAX_DEPTH in the JSON columns (every page and the
    # admin read them); the calls' raw arguments text keeps a deeper value whole.
    data = cut_deep(request.data)[0] or None
    row = ApprovalRequest(
        run=run,
        agent=run.agent,
        request_id=request.id,
        kind=request.kind,
        prompt=request.prompt,
        url=request.url or "",
        data=data,
        expires_at=_expiry_of(request),
    )
    row.search_text = row.build_search_text()  # what ApprovalRequest.save adds to a new row
    statements.insert([row], keys=True)
    if request.kind == "tool_call":
        calls = [
            RequestCall(
                request=row,
                position=i,
                call_id=c.id,
                tool_name=c.name,
                input=cut_deep(c.input)[0],
                arguments=c.arguments,
            )
            for i, c in enumerate(relay_calls_of(request))
        ]
    elif data and data.get("callId"):
        tool = data.get("tool") or ""
        inp = data.get("input") if isinstance(data.get("input"), dict) else {}
        calls = [
            RequestCall(
                request=row,
                position=0,
                call_id=data["callId"],
                tool_name=tool or request.kind,
                input=inp,
                arguments=str(data.get("arguments") or ""),
            )
        ]
    else:
        calls = []
    statements.insert(calls, keys=True)
    return row


def lock_request(request_id: str) -> ApprovalRequest:
    """The request under a row lock, or DoesNotExist; AlreadyDecided if not pending."""
    # Lock the request row alone: a joined row read before the lock wait would be stale.
    found = statements.select(ApprovalRequest, {"request_id": request_id}, for_update=True)
    if not found:
        raise ApprovalRequest.DoesNotExist(f"no request {request_id!r}")
    row = found[0]
    if row.state != State.PENDING:
        decided_by = row.decided_by  # read after the lock: the winner's commit is visible
        raise AlreadyDecided(
            request_id=row.request_id,
            state=row.state,
            decided_by=decided_by.get_username() if decided_by else None,
            decided_at=row.decided_at,
        )
    return row


def record_decision(
    row: ApprovalRequest,
    user: Any,
    new_state: str,
    answer: Answer | None,
    reason: str,
    *,
    resume: bool = True,
    decider: str | None = None,
    **detail: Any,
) -> bool:
    """Write the decision on a locked pending request; with `resume`, put its run back in the
    queue's state if it waits on this request. True when it did: the caller enqueues the run
    (`row.run_id`) in the same transaction. `detail` goes into the decision's audit event (a
    rule applied to pending requests names itself there, as the worker's rules do).

    `decider` is who decided for the metrics (`metrics.DECIDED_BY`; a decision rule passes
    "rule"); by default a person when `user` is signed in, else expiry or the system."""
    check_transition("request", row.state, new_state)
    old = row.state
    row.state = new_state
    row.answer = answer.to_dict() if answer is not None else None
    row.reason = reason
    row.decided_by = user if getattr(user, "is_authenticated", False) else None
    row.decided_at = timezone.now()
    row.save(update_fields=["state", "answer", "reason", "decided_by", "decided_at"])
    count_decision_on_commit(row, decider or _decider(row, new_state))
    run = Run(pk=row.run_id)  # the events' run: its row is written below, not read
    trail: list[Event] = []
    append_event(
        run,
        f"request_{new_state}",
        request=row,
        actor=user,
        from_state=old,
        to_state=new_state,
        into=trail,
        reason=reason,
        answer=row.answer,
        model_reads=model_reads(row, answer, reason),
        **detail,
    )
    # One conditional UPDATE takes the run's row lock and checks it still waits (a failed
    # run keeps its decided request: a retry applies it then).
    resumed = resume and _run_resume(row.run_id)
    if resumed:
        run.status = RunStatus.PENDING  # what the UPDATE found
        set_run_status(
            run,
            RunStatus.QUEUED,
            actor=user,
            action="run_resumed",
            into=trail,
            request_id=row.request_id,
        )
    statements.insert(trail)
    events.announce(run_id=row.run_id, request_pk=row.pk, row=row)
    return resumed


def _decider(row: ApprovalRequest, new_state: str) -> str:
    if row.decided_by is not None:
        return "person"
    return "expiry" if new_state == State.EXPIRED else "system"


def count_decision_on_commit(row: ApprovalRequest, decider: str) -> None:
    """Count the decision once it commits: a rolled-back one was never made."""
    created_at = row.__dict__.get("created_at")  # never a query for a deferred field
    waited = (row.decided_at - created_at).total_seconds() if created_at else 0.0
    agent, outcome = row.agent, row.state
    transaction.on_commit(
        lambda: metrics.decision_made(
            agent=agent, outcome=outcome, decided_by=decider, waited_seconds=waited
        )
    )


def _run_resume(run_id: int) -> bool:
    """Pending -> queued, as `set_run_status` would write it, if the run is pending."""
    queued = statements.update(
        Run,
        {"pk": run_id, "status": RunStatus.PENDING},
        {"status": RunStatus.QUEUED, "updated_at": timezone.now()},
        add={"version": 1},
    )
    return queued == 1


def model_reads(row: ApprovalRequest, answer: Answer | None, reason: str) -> str:
    """The text the model will see for a refusal (kept in the audit trail)."""
    if answer is None or answer.ok:
        return ""
    if row.is_relay:
        # The relay calls' names ride the request's own data: no second read of its calls.
        return "; ".join(decline_text(name, answer.reason) for name in row.relay_tool_names())
    return f"declined/expired: {row.prompt} (reason: {answer.reason or DEFAULT_REASON})"
