"""Every write to runs, requests, executions and the audit trail happens here.

Each state change runs in one transaction, re-reads its rows under `select_for_update`, is
checked against `ALLOWED_TRANSITIONS`, appends an audit `Event`, and enqueues the follow-up
task in the SAME transaction (the task queue lives in the same database), so a decision and
the resume it causes commit together or not at all.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from toolnexus import Answer, Request, RunResult
from toolnexus.relay import RelayResult, answer_declined, decline_text, relay_answer, relay_calls_of
from toolnexus.schema import schema_errors

from . import agents
from .exceptions import AlreadyDecided, InvalidInput, InvalidTransition, LeaseLost, NotAllowed
from .models import ApiToken, ApprovalRequest, Event, RequestCall, Run, ToolExecution

log = logging.getLogger(__name__)

RunStatus = Run.Status
State = ApprovalRequest.State
Decision = RequestCall.Decision

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
        RunStatus.INCOMPLETE: set(),
        RunStatus.DONE: set(),
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

DECIDE_PERMISSION = "approvals.decide_request"
START_PERMISSION = "approvals.add_run"
MAX_PROMPT_CHARS = 20_000
MAX_REASON_CHARS = 2_000
MAX_OUTPUT_CHARS = 100_000
DEFAULT_REASON = "declined"


def check_transition(entity: str, current: str, new: str) -> None:
    if new not in ALLOWED_TRANSITIONS[entity].get(current, set()):
        raise InvalidTransition(f"a {entity} cannot go from {current} to {new}")


def _require(user: Any, permission: str, action: str) -> None:
    if user is None or not user.is_authenticated or not user.has_perm(permission):
        raise NotAllowed(f"you do not have permission to {action}")


def _event(
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


def _set_run_status(
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
    _event(run, action, actor=actor, from_state=old, to_state=new, into=into, **detail)


def _enqueue_execution(run: Run) -> None:
    from .tasks import execute_run

    execute_run.enqueue(run.pk)


def _after_commit(fn: Callable[[], None]) -> None:
    transaction.on_commit(fn, robust=True)


def _notify(
    *,
    run_id: int,
    request_pk: int | None = None,
    created: bool = False,
    decided: ApprovalRequest | None = None,
) -> None:
    """Tell live pages after commit (the broadcast module renders and sends)."""
    from . import broadcast

    _after_commit(
        lambda: broadcast.changed(
            run_id=run_id, request_pk=request_pk, created=created, decided=decided
        )
    )


# -- runs ----------------------------------------------------------------------------------


def run_start(
    *, agent: str, prompt: str, started_by: Any = None, check_permission: bool = True
) -> Run:
    if check_permission:
        _require(started_by, START_PERMISSION, "start runs")
    registered = agents.get(agent) if isinstance(agent, str) else None
    if registered is None:
        raise InvalidInput(f"agent: no agent named {agent!r} is registered")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInput("prompt: must be a non-empty string")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidInput(f"prompt: must be at most {MAX_PROMPT_CHARS} characters")
    with transaction.atomic():
        run = Run.objects.create(
            agent=registered.name,
            prompt=prompt,
            system_prompt=registered.system_prompt,
            started_by=started_by if getattr(started_by, "is_authenticated", False) else None,
        )
        _event(run, "run_started", actor=started_by, to_state=run.status, agent=run.agent)
        _enqueue_execution(run)
        _notify(run_id=run.pk)
    return run


def run_claim(*, run_id: int, worker_id: str) -> Run | None:
    """Take a queued run (or one whose worker's lease lapsed) for this worker, or None."""
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            return None
        lapsed = (
            run.status == RunStatus.RUNNING
            and run.lease_expires_at is not None
            and run.lease_expires_at < now
        )
        if run.status == RunStatus.QUEUED:
            _set_run_status(run, RunStatus.RUNNING, action="run_claimed", worker=worker_id)
        elif lapsed:
            _event(
                run,
                "run_taken_over",
                from_state=run.status,
                to_state=run.status,
                worker=worker_id,
                previous=run.worker_id,
            )
        else:
            return None
        run.worker_id = worker_id
        run.lease_expires_at = now + timedelta(seconds=settings.TOOLNEXUS_RUN_LEASE_SECONDS)
        run.attempts += 1
        run.error = ""
        run.save()
        _notify(run_id=run.pk)
    return run


def _locked_own_run(run_id: int, worker_id: str, *, only: tuple[str, ...] = ()) -> Run:
    runs = Run.objects.select_for_update()
    run = (runs.only("id", "status", "worker_id", *only) if only else runs).get(pk=run_id)
    if run.status != RunStatus.RUNNING or run.worker_id != worker_id:
        raise LeaseLost(
            f"run {run_id} is no longer held by worker {worker_id} (status {run.status})"
        )
    return run


def run_checkpoint(
    *,
    run_id: int,
    worker_id: str,
    messages: list[dict[str, Any]],
    applied_request_pk: int | None = None,
) -> None:
    """Store the transcript after a step and renew the worker's lease."""
    with transaction.atomic():
        # The transcript is about to be replaced: no need to read the stored one.
        run = _locked_own_run(run_id, worker_id, only=("lease_expires_at", "updated_at"))
        run.messages = messages
        run.lease_expires_at = timezone.now() + timedelta(
            seconds=settings.TOOLNEXUS_RUN_LEASE_SECONDS
        )
        run.save(update_fields=["messages", "lease_expires_at", "updated_at"])
        if applied_request_pk is not None:
            ApprovalRequest.objects.filter(pk=applied_request_pk, applied_at__isnull=True).update(
                applied_at=timezone.now()
            )


def _expiry_of(request: Request) -> datetime | None:
    if request.expires_at:
        return parse_datetime(request.expires_at.replace("Z", "+00:00").replace("z", "+00:00"))
    ttl = settings.TOOLNEXUS_REQUEST_TTL_SECONDS
    return timezone.now() + timedelta(seconds=ttl) if ttl > 0 else None


def _create_request(run: Run, request: Request) -> ApprovalRequest:
    data = request.data or None
    row = ApprovalRequest.objects.create(
        run=run,
        agent=run.agent,
        request_id=request.id,
        kind=request.kind,
        prompt=request.prompt,
        url=request.url or "",
        data=data,
        expires_at=_expiry_of(request),
    )
    if request.kind == "tool_call":
        calls = [
            RequestCall(
                request=row,
                position=i,
                call_id=c.id,
                tool_name=c.name,
                input=c.input,
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
    RequestCall.objects.bulk_create(calls)
    return row


def run_store_result(
    *, run_id: int, worker_id: str, result: RunResult, applied_request_pk: int | None = None
) -> Run:
    """Store what an execution ended with: done, incomplete, or halted on a new request."""
    with transaction.atomic():
        run = _locked_own_run(run_id, worker_id)
        run.messages = result.messages
        run.turns += result.turns
        run.usage = {k: run.usage.get(k, 0) + v for k, v in result.usage.items()}
        run.text = result.text if result.status != "pending" else run.text
        run.worker_id = ""
        run.lease_expires_at = None
        if applied_request_pk is not None:
            ApprovalRequest.objects.filter(pk=applied_request_pk, applied_at__isnull=True).update(
                applied_at=timezone.now()
            )
        request_pk = None
        if result.status == "pending" and result.pending is not None:
            row = _create_request(run, result.pending)
            request_pk = row.pk
            _set_run_status(
                run,
                RunStatus.PENDING,
                action="run_halted",
                request_id=row.request_id,
                kind=row.kind,
            )
            _event(run, "request_created", request=row, to_state=row.state, prompt=row.prompt)
        elif result.status == "incomplete":
            _set_run_status(run, RunStatus.INCOMPLETE, action="run_incomplete", limit=result.limit)
            run.finished_at = timezone.now()
        else:
            _set_run_status(run, RunStatus.DONE, action="run_done", text=result.text[:500])
            run.finished_at = timezone.now()
        run.save()
        _notify(run_id=run.pk, request_pk=request_pk, created=request_pk is not None)
    return run


def run_fail(*, run_id: int, worker_id: str, error: str) -> None:
    with transaction.atomic():
        try:
            run = _locked_own_run(run_id, worker_id)
        except LeaseLost:
            log.warning("run %s failed in a worker that no longer holds it: %s", run_id, error)
            return
        run.error = error[:5000]
        run.worker_id = ""
        run.lease_expires_at = None
        _set_run_status(run, RunStatus.FAILED, action="run_failed", error=error[:500])
        run.finished_at = timezone.now()
        run.save()
        _notify(run_id=run.pk)


def run_retry(*, run_id: int, user: Any) -> Run:
    """Queue a failed run again; it resumes from its stored transcript and decisions."""
    _require(user, START_PERMISSION, "retry runs")
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.status != RunStatus.FAILED:
            # Only a failure is retried: a pending run waits for a person, not a worker.
            raise InvalidTransition(
                f"run {run.pk} is {run.status}: only a failed run can be retried"
            )
        _set_run_status(
            run, RunStatus.QUEUED, actor=user, action="run_retried", previous_error=run.error[:500]
        )
        run.error = ""
        run.finished_at = None
        run.save()
        _enqueue_execution(run)
        _notify(run_id=run.pk)
    return run


def run_cancel(*, run_id: int, user: Any, reason: str = "") -> Run:
    """Stop a run for good; its open request (if any) is cancelled with it."""
    _require(user, DECIDE_PERMISSION, "cancel runs")
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        open_request = (
            ApprovalRequest.objects.select_for_update().filter(run=run, state=State.PENDING).first()
        )
        if open_request is not None:
            _decide(
                open_request,
                user,
                State.CANCELLED,
                answer_declined(open_request.request_id, "cancelled"),
                reason or "cancelled",
                resume=False,
            )
        _set_run_status(run, RunStatus.CANCELLED, actor=user, action="run_cancelled", reason=reason)
        run.worker_id = ""
        run.lease_expires_at = None
        run.finished_at = timezone.now()
        run.save()
        _notify(run_id=run.pk, request_pk=open_request.pk if open_request else None)
    return run


_forgotten: set[str] = set()


def forget_run(worker_id: str) -> None:
    """Stop renewing one execution's lease (its worker could not write the outcome)."""
    _forgotten.add(worker_id)


def runs_renew_leases(*, worker_prefix: str) -> int:
    """Extend the leases of the runs held by one worker process (its heartbeat)."""
    until = timezone.now() + timedelta(seconds=settings.TOOLNEXUS_RUN_LEASE_SECONDS)
    return (
        Run.objects.filter(status=RunStatus.RUNNING, worker_id__startswith=worker_prefix)
        .exclude(worker_id__in=_forgotten)
        .update(lease_expires_at=until)
    )


def run_requeue(*, run_id: int, worker_id: str, reason: str) -> None:
    """Give a run held by this worker back to the queue; it continues from its checkpoint."""
    with transaction.atomic():
        run = _locked_own_run(run_id, worker_id)
        _set_run_status(
            run, RunStatus.QUEUED, action="run_requeued", reason=reason, worker=worker_id
        )
        run.worker_id = ""
        run.lease_expires_at = None
        run.save()
        _enqueue_execution(run)
        _notify(run_id=run.pk)


def runs_recover_stale(*, now: datetime | None = None) -> int:
    """Queue again every running run whose worker stopped renewing its lease."""
    now = now or timezone.now()
    recovered = 0
    for run_id in Run.objects.filter(
        status=RunStatus.RUNNING, lease_expires_at__lt=now
    ).values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            if (
                run.status != RunStatus.RUNNING
                or run.lease_expires_at is None
                or run.lease_expires_at >= now
            ):
                continue
            _set_run_status(run, RunStatus.QUEUED, action="run_recovered", worker=run.worker_id)
            run.worker_id = ""
            run.lease_expires_at = None
            run.save()
            _enqueue_execution(run)
            _notify(run_id=run.pk)
            recovered += 1
    return recovered


# -- decisions -----------------------------------------------------------------------------


def _lock_request(request_id: str) -> ApprovalRequest:
    """The request under a row lock, or DoesNotExist; AlreadyDecided if not pending."""
    # Lock the request row alone: a joined row read before the lock wait would be stale.
    row = ApprovalRequest.objects.select_for_update().get(request_id=request_id)
    if row.state != State.PENDING:
        decided_by = row.decided_by  # read after the lock: the winner's commit is visible
        raise AlreadyDecided(
            request_id=row.request_id,
            state=row.state,
            decided_by=decided_by.get_username() if decided_by else None,
            decided_at=row.decided_at,
        )
    return row


def _decide(
    row: ApprovalRequest,
    user: Any,
    new_state: str,
    answer: Answer | None,
    reason: str,
    *,
    resume: bool = True,
) -> None:
    """Write the decision on a locked pending request and, if asked, queue the run's resume."""
    check_transition("request", row.state, new_state)
    old = row.state
    row.state = new_state
    row.answer = answer.to_dict() if answer is not None else None
    row.reason = reason
    row.decided_by = user if getattr(user, "is_authenticated", False) else None
    row.decided_at = timezone.now()
    row.save(update_fields=["state", "answer", "reason", "decided_by", "decided_at"])
    # Only what a status change touches: the transcript can be large and is not needed here.
    run = (
        Run.objects.select_for_update()
        .only("id", "status", "version", "updated_at")
        .get(pk=row.run_id)
    )
    events: list[Event] = []
    _event(
        run,
        f"request_{new_state}",
        request=row,
        actor=user,
        from_state=old,
        to_state=new_state,
        into=events,
        reason=reason,
        answer=row.answer,
        model_reads=_model_reads(row, answer, reason),
    )
    # A failed run keeps its decided request: a retry applies it then.
    if resume and run.status == RunStatus.PENDING:
        _set_run_status(
            run,
            RunStatus.QUEUED,
            actor=user,
            action="run_resumed",
            into=events,
            request_id=row.request_id,
        )
        run.save(update_fields=["status", "version", "updated_at"])
        _enqueue_execution(run)
    Event.objects.bulk_create(events)
    _notify(run_id=run.pk, request_pk=row.pk, decided=row)


def _model_reads(row: ApprovalRequest, answer: Answer | None, reason: str) -> str:
    """The text the model will see for a refusal (kept in the audit trail)."""
    if answer is None or answer.ok:
        return ""
    if row.is_relay:
        # The relay calls' names ride the request's own data: no second read of its calls.
        return "; ".join(decline_text(name, answer.reason) for name in row.relay_tool_names())
    return f"declined/expired: {row.prompt} (reason: {answer.reason or DEFAULT_REASON})"


def _clean_reason(reason: Any) -> str:
    if reason is None:
        return DEFAULT_REASON
    if not isinstance(reason, str):
        raise InvalidInput("reason: must be a string")
    reason = reason.strip()
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidInput(f"reason: must be at most {MAX_REASON_CHARS} characters")
    return reason or DEFAULT_REASON


def _clean_output(output: Any, field: str = "output") -> str:
    if not isinstance(output, str):
        raise InvalidInput(f"{field}: must be a string")
    if len(output) > MAX_OUTPUT_CHARS:
        raise InvalidInput(f"{field}: must be at most {MAX_OUTPUT_CHARS} characters")
    return output


def tool_schema(agent_name: str, tool_name: str) -> dict[str, Any] | None:
    agent = agents.get(agent_name)
    return agent.tool_schema(tool_name) if agent is not None else None


def input_problems(value: Any, schema: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with edited arguments, each naming the argument."""
    problems = [
        p.replace("$.", "", 1).replace("$", "input", 1) for p in schema_errors(value, schema)
    ]
    if bad := _non_finite(value, "input"):
        problems.append(f"{bad.removeprefix('input.')}: must be a finite number")
    return problems


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity inside a JSON-like value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, Mapping):
        items = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((found for p, v in items if (found := _non_finite(v, p))), None)


def _validated_input(value: Any, schema: Mapping[str, Any] | None, field: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field}: must be an object")
    if bad := _non_finite(value, field):
        raise InvalidInput(f"{bad}: must be a finite number (no NaN or Infinity)")
    problems = schema_errors(dict(value), schema)
    if problems:
        raise InvalidInput(f"{field}: " + "; ".join(p.replace("$", field, 1) for p in problems))
    return dict(value)


def request_approve(
    *,
    request_id: str,
    user: Any,
    input: Any = None,
    output: Any = None,
    calls: Mapping[str, Mapping[str, Any]] | None = None,
) -> ApprovalRequest:
    """Approve a request: as shown, with edited input, or with a typed output.

    A relay request carrying several calls is decided per call with `calls`:
    `{call_id: {"decision": "approve"|"output"|"decline", "input": ..., "output": ..., "reason": ...}}`;
    calls left out are approved as they are.
    """
    _require(user, DECIDE_PERMISSION, "decide requests")
    with transaction.atomic():
        row = _lock_request(request_id)
        if row.is_relay:
            new_state, answer = _decide_relay_calls(row, input=input, output=output, calls=calls)
            reason = ""
        else:
            if calls:
                raise InvalidInput(
                    "calls: only a relay request (kind tool_call) is decided per call"
                )
            new_state, answer = _decide_single(row, input=input, output=output)
            reason = ""
        _decide(row, user, new_state, answer, reason)
    return row


def _decide_single(row: ApprovalRequest, *, input: Any, output: Any) -> tuple[str, Answer]:
    if input is not None and output is not None:
        raise InvalidInput("give either input or output, not both")
    data: dict[str, Any] | None = None
    if row.kind == "approval":
        if output is not None:
            raise InvalidInput("output: an approval runs the tool; edit its input instead")
        original = (row.data or {}).get("input")
        if input is not None and input != original:
            tool = (row.data or {}).get("tool", "")
            data = {"input": _validated_input(input, tool_schema(row.agent, tool), "input")}
            RequestCall.objects.filter(request=row).update(
                decision=Decision.EDIT, edited_input=data["input"]
            )
        else:  # as shown (arguments "edited" to what they were are a plain approval)
            RequestCall.objects.filter(request=row).update(decision=Decision.APPROVE)
        return State.APPROVED, Answer(id=row.request_id, ok=True, data=data)
    if input is not None:
        data = _validated_input(input, (row.data or {}).get("schema"), "input")
    elif output is not None:
        text = _clean_output(output)
        if not text.strip():
            raise InvalidInput("output: type the answer; an empty answer is not sent")
        data = {"output": text}
    return (State.ANSWERED if data else State.APPROVED), Answer(
        id=row.request_id, ok=True, data=data
    )


def _decide_relay_calls(
    row: ApprovalRequest,
    *,
    input: Any,
    output: Any,
    calls: Mapping[str, Mapping[str, Any]] | None,
    fields: Mapping[str, str] | None = None,
) -> tuple[str, Answer | None]:
    """Record a decision on every call of a relay request and work out the answer.

    `fields` names each call's place in the caller's input for error messages (the API's
    `calls.<id>`, an Answer's `data.results[i]`); without it, `calls.<id>`.
    """
    call_rows = list(row.calls.select_for_update().order_by("position"))
    if not call_rows:
        raise InvalidInput("this relay request carries no calls")
    if calls is not None and not isinstance(calls, Mapping):
        raise InvalidInput("calls: must be an object keyed by call id")
    if input is not None and output is not None:
        raise InvalidInput("give either input or output, not both")
    if (input is not None or output is not None) and len(call_rows) > 1:
        raise InvalidInput(
            f"this request carries {len(call_rows)} calls: decide each one with calls"
        )
    if calls:
        unknown = sorted(set(calls) - {c.call_id for c in call_rows})
        if unknown:
            raise InvalidInput(f"calls: unknown call id(s) {', '.join(unknown)}")
    agent = agents.get(row.agent)
    shorthand = len(call_rows) == 1 and not calls
    for call in call_rows:
        spec = dict((calls or {}).get(call.call_id) or {})
        if shorthand:  # top-level input/output decide the only call
            spec = {"input": input, "output": output}
        decision = spec.get("decision") or (
            "output" if spec.get("output") is not None else "approve"
        )
        field = "" if shorthand else (fields or {}).get(call.call_id, f"calls.{call.call_id}")
        prefix = f"{field}." if field else ""
        has_executor = agent is not None and agent.executor_for(call.tool_name) is not None
        if decision == Decision.DECLINE:
            call.decision, call.reason = Decision.DECLINE, _clean_reason(spec.get("reason"))
            call.output, call.is_error = decline_text(call.tool_name, call.reason), True
        elif decision == Decision.OUTPUT or spec.get("output") is not None:
            raw = spec.get("output")
            text = _clean_output("" if raw is None else raw, f"{prefix}output")
            if has_executor and not agent.allow_typed_output:
                raise InvalidInput(
                    f"{prefix}output: {call.tool_name} runs on the host once approved; approve"
                    " or decline it (agent "
                    f"{row.agent!r} does not take a typed result instead of running it)"
                )
            if not text.strip():
                raise InvalidInput(
                    f"{prefix}output: type the result for {call.tool_name}; an empty result"
                    " is not sent"
                )
            call.decision, call.output = Decision.OUTPUT, text
            call.is_error = spec.get("is_error") is True
        elif decision == Decision.APPROVE:
            if not has_executor:
                raise InvalidInput(
                    f"{prefix}output: {call.tool_name} has no executor here; type its result"
                    " or decline it"
                )
            if spec.get("input") is not None:
                schema = agent.tool_schema(call.tool_name)
                call.edited_input = _validated_input(spec["input"], schema, f"{prefix}input")
                call.decision = (
                    Decision.EDIT if call.edited_input != call.input else Decision.APPROVE
                )
                if call.decision == Decision.APPROVE:
                    call.edited_input = None  # "edited" to the same arguments: a plain approval
            else:
                call.decision = Decision.APPROVE
        else:
            raise InvalidInput(f"{prefix}decision: must be approve, output or decline")
        call.save()
    if all(c.decision == Decision.DECLINE for c in call_rows):
        reasons = sorted({c.reason for c in call_rows})
        return State.DECLINED, answer_declined(
            row.request_id, reasons[0] if len(reasons) == 1 else "; ".join(reasons)
        )
    if any(c.decision in (Decision.APPROVE, Decision.EDIT) for c in call_rows):
        return State.APPROVED, None  # the worker runs the executors, then builds the answer
    return State.ANSWERED, relay_answer(
        row.request_id, [RelayResult(c.call_id, c.output or "", c.is_error) for c in call_rows]
    )


def _relay_calls_from_answer(
    row: ApprovalRequest, data: Mapping[str, Any]
) -> tuple[dict[str, dict[str, Any]] | None, dict[str, str], Any]:
    """An ok Answer for a relay request as per-call decisions: `data.results` by call id, or
    the one-call shorthand `data.output` / `data.isError`. Returns (calls, field names,
    shorthand output)."""
    extra = sorted(set(data) - {"results", "output", "isError"})
    if extra:
        raise InvalidInput(
            f"data: unexpected key(s) {', '.join(extra)}; a relay answer carries results"
            " (or output and isError for one call)"
        )
    if "results" in data:
        if "output" in data:
            raise InvalidInput("data: give results or output, not both")
        results = data["results"]
        if not isinstance(results, list):
            raise InvalidInput("data.results: must be a list of {id, output, isError}")
        calls: dict[str, dict[str, Any]] = {}
        fields: dict[str, str] = {}
        for i, entry in enumerate(results):
            where = f"data.results[{i}]"
            if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), str):
                raise InvalidInput(f"{where}.id: must be the call id, a string")
            if entry["id"] in calls:
                raise InvalidInput(f"{where}.id: call {entry['id']} has two results")
            if not isinstance(entry.get("output"), str):
                raise InvalidInput(f"{where}.output: must be a string")
            if "isError" in entry and not isinstance(entry["isError"], bool):
                raise InvalidInput(f"{where}.isError: must be true or false")
            calls[entry["id"]] = {
                "decision": Decision.OUTPUT,
                "output": entry["output"],
                "is_error": entry.get("isError") is True,
            }
            fields[entry["id"]] = where
        known = {c.call_id for c in row.calls.all()}
        unknown = sorted(set(calls) - known)
        if unknown:
            raise InvalidInput(f"data.results: unknown call id(s) {', '.join(unknown)}")
        for call_id in known - set(calls):
            fields[call_id] = f"data.results (call {call_id})"
        return calls, fields, None
    if "isError" in data and not isinstance(data["isError"], bool):
        raise InvalidInput("data.isError: must be true or false")
    if "output" in data and not isinstance(data["output"], str):
        raise InvalidInput("data.output: must be a string")
    return None, {}, data.get("output")


def request_answer(*, request_id: str, user: Any, answer: Any) -> ApprovalRequest:
    """Decide with an `Answer` in wire shape, as a host would give the engine.

    The answer is recorded per call exactly like the same decision made with approve or
    decline: typed results, edited input, a decline. It is never stored as an override the
    record does not show.
    """
    _require(user, DECIDE_PERMISSION, "decide requests")
    try:
        parsed = answer if isinstance(answer, Answer) else Answer.from_dict(answer)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if bad := _non_finite(parsed.data, "data"):
        raise InvalidInput(f"{bad}: must be a finite number (no NaN or Infinity)")
    if parsed.id != request_id:
        raise InvalidInput(
            f"id: the answer's id {parsed.id!r} does not echo the request id {request_id!r}"
        )
    if not parsed.ok:
        return request_decline(request_id=request_id, user=user, reason=parsed.reason)
    data = parsed.data or {}
    with transaction.atomic():
        row = _lock_request(request_id)
        if row.is_relay:
            calls, fields, output = _relay_calls_from_answer(row, data)
            if output is not None:  # the one-call shorthand
                call_ids = [c.call_id for c in row.calls.all()]
                if len(call_ids) != 1:
                    raise InvalidInput(
                        f"data.output: this request carries {len(call_ids)} calls; give"
                        " data.results with one result per call id"
                    )
                calls = {
                    call_ids[0]: {
                        "decision": Decision.OUTPUT,
                        "output": output,
                        "is_error": data.get("isError") is True,
                    }
                }
                fields = {call_ids[0]: "data"}
            new_state, decided = _decide_relay_calls(
                row, input=None, output=None, calls=calls, fields=fields
            )
        elif row.kind == "approval":
            extra = sorted(set(data) - {"input"})
            if extra:
                raise InvalidInput(
                    f"data: unexpected key(s) {', '.join(extra)}; an approval answer carries"
                    " only input (the edited arguments)"
                )
            new_state, decided = _decide_single(row, input=data.get("input"), output=None)
        else:
            new_state, decided = _decide_single(row, input=data or None, output=None)
        _decide(row, user, new_state, decided, "")
    return row


def request_decline(*, request_id: str, user: Any, reason: Any = "") -> ApprovalRequest:
    """Refuse a request; the reason (default "declined") reaches the model."""
    _require(user, DECIDE_PERMISSION, "decide requests")
    reason = _clean_reason(reason)
    with transaction.atomic():
        row = _lock_request(request_id)
        for call in row.calls.select_for_update():
            call.decision, call.reason = Decision.DECLINE, reason
            call.output, call.is_error = decline_text(call.tool_name, reason), True
            call.save(update_fields=["decision", "reason", "output", "is_error"])
        _decide(row, user, State.DECLINED, answer_declined(row.request_id, reason), reason)
    return row


def request_cancel(*, request_id: str, user: Any, reason: str = "") -> ApprovalRequest:
    """Cancel the request and stop its run."""
    row = ApprovalRequest.objects.only("run_id").get(request_id=request_id)
    run_cancel(run_id=row.run_id, user=user, reason=_clean_reason(reason or "cancelled"))
    return ApprovalRequest.objects.get(pk=row.pk)


def request_expire(*, request_id: str, user: Any = None) -> ApprovalRequest:
    """Decline an overdue request with reason "expired"; its run resumes."""
    if user is not None:
        _require(user, DECIDE_PERMISSION, "expire requests")
    with transaction.atomic():
        row = _lock_request(request_id)
        RequestCall.objects.filter(request=row).update(
            decision=Decision.DECLINE, reason="expired", is_error=True
        )
        _decide(row, user, State.EXPIRED, answer_declined(row.request_id, "expired"), "expired")
    return row


def requests_expire_overdue(*, now: datetime | None = None) -> int:
    now = now or timezone.now()
    expired = 0
    for request_id in ApprovalRequest.objects.filter(
        state=State.PENDING, expires_at__lte=now
    ).values_list("request_id", flat=True):
        try:
            request_expire(request_id=request_id)
            expired += 1
        except (AlreadyDecided, ApprovalRequest.DoesNotExist):
            continue  # decided by someone else in the meantime
    return expired


def request_store_answer(*, request_pk: int, answer: Answer) -> None:
    """The worker built a relay answer from executor results: keep it with the decision."""
    with transaction.atomic():
        row = ApprovalRequest.objects.select_for_update().get(pk=request_pk)
        if row.answer is None:
            row.answer = answer.to_dict()
            row.save(update_fields=["answer"])


def request_call_store_output(*, call_pk: int, output: str, is_error: bool) -> None:
    RequestCall.objects.filter(pk=call_pk).update(output=output, is_error=is_error)


# -- tool execution journal ----------------------------------------------------------------


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


# -- API tokens ----------------------------------------------------------------------------


def api_token_create(*, user: Any, name: str = "") -> tuple[str, ApiToken]:
    token = ApiToken.generate()
    row = ApiToken.objects.create(
        user=user, name=name[:100], prefix=token[:12], key_hash=ApiToken.hash(token)
    )
    return token, row


def api_token_authenticate(token: str) -> Any:
    """The active user a bearer token belongs to, or None."""
    if not token or len(token) > 200:
        return None
    row = (
        ApiToken.objects.select_related("user")
        .filter(key_hash=ApiToken.hash(token), revoked_at__isnull=True)
        .first()
    )
    if row is None or not row.user.is_active:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=row.pk).update(
            last_used_at=now
        )  # throttled: not a write per request
    return row.user
