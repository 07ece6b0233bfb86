"""What a worker writes while it drives a run: its claim and lease, checkpoints, the outcome,
and the results of the calls it executed for a decided request."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from toolnexus import Answer, RunResult

from .. import events
from ..conf import app_settings
from ..domain import statements
from ..domain.exceptions import LeaseLost
from ..domain.records import append_event, create_request, set_run_status
from ..models import ApprovalRequest, Event, RequestCall, RequestRequirement, Rule, Run
from . import taskrow

log = logging.getLogger(__name__)

RunStatus = Run.Status


def run_claim(*, run_id: int, worker_id: str) -> Run | None:
    """Take a queued run (or one whose worker's lease lapsed) for this worker, or None."""
    claimed = run_claim_step(run_id=run_id, worker_id=worker_id)
    return claimed[0] if claimed is not None else None


# What a claim under the row lock writes on the run row (never the transcript).
_CLAIM_FIELDS = ["status", "version", "worker_id", "lease_expires_at", "attempts", "error"]


def run_claim_step(*, run_id: int, worker_id: str) -> tuple[Run, ApprovalRequest | None] | None:
    """Claim the run (as `run_claim`) and, in the same transaction, read the decided request
    whose answer is not yet in its transcript (with its calls), if any: one transaction for
    what a step starts from. None when the run is not this worker's to take. Inside another
    transaction (a worker's claim of the task row) it is part of that one: no savepoint."""
    now = timezone.now()
    lease = now + timedelta(seconds=app_settings.RUN_LEASE_SECONDS)
    with transaction.atomic(savepoint=False):
        # A queued run, the common case: one conditional UPDATE claims it (queued -> running,
        # the only way out of queued a worker takes) and reads it back.
        run = statements.update(
            Run,
            {"pk": run_id, "status": RunStatus.QUEUED},
            {
                "status": RunStatus.RUNNING,
                "worker_id": worker_id,
                "lease_expires_at": lease,
                "error": "",
                "updated_at": now,
            },
            add={"attempts": 1, "version": 1},
            returning=True,
        )
        if run is not None:
            trail: list[Event] = []
            append_event(
                run,
                "run_claimed",
                from_state=RunStatus.QUEUED,
                to_state=RunStatus.RUNNING,
                worker=worker_id,
                into=trail,
            )
            statements.insert(trail)
        else:
            run = _claim_locked(run_id, worker_id, now, lease)
            if run is None:
                return None
        request = request_to_apply(run)
        events.announce(run_id=run.pk, status_only=True)
    return run, request


def _claim_locked(run_id: int, worker_id: str, now: Any, lease: Any) -> Run | None:
    """The claim under the run's row lock, where the conditional UPDATE matched nothing: a
    running run whose worker's lease lapsed is taken over, and a run queued again since
    that UPDATE looked (a requeue committed in between) is claimed; None for any other run
    (held, finished, cancelled, gone)."""
    run = Run.objects.select_for_update().filter(pk=run_id).first()
    if run is None:
        return None
    lapsed = (
        run.status == RunStatus.RUNNING
        and run.lease_expires_at is not None
        and run.lease_expires_at < now
    )
    if run.status == RunStatus.QUEUED:
        set_run_status(run, RunStatus.RUNNING, action="run_claimed", worker=worker_id)
    elif lapsed:
        append_event(
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
    run.lease_expires_at = lease
    run.attempts += 1
    run.error = ""
    run.save(update_fields=[*_CLAIM_FIELDS, "updated_at"])
    return run


def request_to_apply(run: Run) -> ApprovalRequest | None:
    """The decided request whose answer is not yet in the transcript, if any (its calls
    read with it: `call_list()`). A run with no transcript yet never halted: nothing to read."""
    if not run.messages:
        return None
    found = statements.select(
        ApprovalRequest,
        {"run_id": run.pk, "applied_at__isnull": True, "state__ne": ApprovalRequest.State.PENDING},
        order_by=("-created_at", "-id"),
        limit=1,
    )
    if not found:
        return None
    request = found[0]
    request.run = run  # as the run's related manager would have set it (no query later)
    request.listed_calls = statements.select(
        RequestCall, {"request_id": request.pk}, order_by=("position",)
    )
    for call in request.listed_calls:
        call.request = request
    return request


def locked_own_run(run_id: int, worker_id: str) -> Run:
    run = Run.objects.select_for_update().get(pk=run_id)
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
        _update_own_run(
            run_id,
            worker_id,
            messages=messages,
            lease_expires_at=timezone.now() + timedelta(seconds=app_settings.RUN_LEASE_SECONDS),
        )
        if applied_request_pk is not None:
            _mark_applied(applied_request_pk)


def _update_own_run(
    run_id: int, holder: str, /, add: dict[str, int] | None = None, **fields: Any
) -> None:
    """Write `fields` (and `updated_at`, now unless given), and add `add` to counters, on a
    run the worker `holder` still holds, or raise LeaseLost: one conditional UPDATE, which
    takes the row's lock and checks the holder in one statement."""
    held = {"pk": run_id, "status": RunStatus.RUNNING, "worker_id": holder}
    if not statements.update(Run, held, {"updated_at": timezone.now(), **fields}, add=add):
        status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
        raise LeaseLost(f"run {run_id} is no longer held by worker {holder} (status {status})")


# What storing an outcome writes on the run row (besides its status, version and turns).
_RESULT_WRITE = (
    "messages",
    "usage",
    "text",
    "worker_id",
    "lease_expires_at",
    "finished_at",
    "updated_at",
)


def run_store_result(
    *,
    run: Run,
    worker_id: str,
    result: RunResult,
    applied_request_pk: int | None = None,
    team_state: dict[str, Any] | None = None,
    requirement: Any = None,
) -> Run:
    """Store what an execution ended with: done, incomplete, or halted on a new request.
    `team_state`: a team run's new runtime state (execution.teams), written with it;
    `requirement`: the require_* or route rule the halt's request carries (execution.rules).

    `run` is the run as this worker claimed it. While a worker holds a run (status running,
    its holder id, new at each claim), only that worker writes its transcript, text and
    usage: the claim's copy of them is current, and the outcome is written without reading
    the row again (counters are added to in the UPDATE itself). A worker that no longer
    holds the run gets LeaseLost and writes nothing."""
    halted = result.status == "pending" and result.pending is not None
    status = (
        RunStatus.PENDING
        if halted
        else RunStatus.INCOMPLETE
        if result.status == "incomplete"
        else RunStatus.DONE
    )
    with transaction.atomic():
        run.messages = result.messages
        run.turns += result.turns
        run.usage = {k: run.usage.get(k, 0) + v for k, v in result.usage.items()}
        run.text = result.text if result.status != "pending" else run.text
        run.worker_id = ""
        run.lease_expires_at = None
        run.updated_at = timezone.now()
        if status != RunStatus.PENDING:
            run.finished_at = run.updated_at
        team = {}
        if team_state is not None:
            run.team_state = team["team_state"] = team_state
        _update_own_run(
            run.pk,
            worker_id,
            **team,
            **{f: getattr(run, f) for f in _RESULT_WRITE},
            # What set_run_status below writes in memory, once the request it names exists.
            status=status,
            add={"turns": result.turns, "version": 1},
        )
        if applied_request_pk is not None:
            _mark_applied(applied_request_pk)
        request_pk, new_request = None, None
        if halted:
            trail: list[Event] = []
            row = new_request = create_request(run, result.pending)
            request_pk = row.pk
            if requirement is not None:
                record_requirement(row, requirement)
            set_run_status(
                run,
                status,
                action="run_halted",
                into=trail,
                request_id=row.request_id,
                kind=row.kind,
            )
            append_event(
                run,
                "request_created",
                request=row,
                to_state=row.state,
                prompt=row.prompt,
                into=trail,
            )
            statements.insert(trail)  # the halt's two events, in one INSERT
        elif status == RunStatus.INCOMPLETE:
            set_run_status(run, status, action="run_incomplete", limit=result.limit)
        else:
            set_run_status(run, status, action="run_done", text=result.text[:500])
        # The worker's task row ends with its run's outcome, not in a commit of its own.
        taskrow.finish_with_outcome(run_id=run.pk, return_value=result.status)
        events.announce(
            run_id=run.pk, request_pk=request_pk, created=request_pk is not None, row=new_request
        )
    return run


def _mark_applied(request_pk: int) -> None:
    """The request's answer is in the transcript now (one UPDATE, a no-op the second time)."""
    statements.update(
        ApprovalRequest,
        {"pk": request_pk, "applied_at__isnull": True},
        {"applied_at": timezone.now()},
    )


def run_fail(
    *,
    run_id: int,
    worker_id: str,
    error: str,
    messages: list[dict[str, Any]] | None = None,
    applied_request_pk: int | None = None,
) -> None:
    """The step failed: `messages`, the transcript it got to if newer than the stored one
    (with the decision `applied_request_pk` applied to it)."""
    with transaction.atomic():
        try:
            run = locked_own_run(run_id, worker_id)
        except LeaseLost:
            log.warning("run %s failed in a worker that no longer holds it: %s", run_id, error)
            return
        if messages is not None:
            run.messages = messages
            if applied_request_pk is not None:
                _mark_applied(applied_request_pk)
        run.error = error[:5000]
        run.worker_id = ""
        run.lease_expires_at = None
        set_run_status(run, RunStatus.FAILED, action="run_failed", error=error[:500])
        run.finished_at = timezone.now()
        run.save()
        events.announce(run_id=run.pk)


class _Forgotten:
    """The executions of this process whose leases its heartbeat no longer renews (their
    worker could not write the outcome, or their task never started), while they still hold
    a run: once another worker took the run over (its lease lapsed), an id is dropped."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        # forget() and the heartbeat's prune run in different threads.
        self.lock = threading.Lock()

    def forget(self, worker_id: str) -> None:
        with self.lock:
            self.ids.add(worker_id)

    def still_held(self) -> list[str]:
        """The forgotten ids that still hold a run (one query, none when nothing is
        forgotten); the others are dropped. The query runs outside the lock: `forget` is
        called when the database fails, and must not wait on a heartbeat's query."""
        with self.lock:
            asked = set(self.ids)
        held: set[str] = set()
        if asked:
            held = set(
                Run.objects.filter(status=RunStatus.RUNNING, worker_id__in=asked).values_list(
                    "worker_id", flat=True
                )
            )
        with self.lock:
            self.ids -= asked - held  # an id forgotten meanwhile was not asked: kept
            return sorted(self.ids)


# The process's forgotten executions (a registry; see _Forgotten).
FORGOTTEN = _Forgotten()


def forget_run(worker_id: str) -> None:
    """Stop renewing one execution's lease (its worker could not write the outcome)."""
    FORGOTTEN.forget(worker_id)


def runs_renew_leases(*, worker_prefix: str) -> int:
    """Extend the leases of the runs held by one worker process (its heartbeat)."""
    until = timezone.now() + timedelta(seconds=app_settings.RUN_LEASE_SECONDS)
    return (
        Run.objects.filter(status=RunStatus.RUNNING, worker_id__startswith=worker_prefix)
        .exclude(worker_id__in=FORGOTTEN.still_held())
        .update(lease_expires_at=until)
    )


def request_store_answer(*, request_pk: int, answer: Answer) -> None:
    """The worker built a relay answer from executor results: keep it with the decision
    (one conditional UPDATE: an answer stored before is kept)."""
    statements.update(
        ApprovalRequest, {"pk": request_pk, "answer__isnull": True}, {"answer": answer.to_dict()}
    )


def request_call_store_output(*, call_pk: int, output: str, is_error: bool) -> None:
    statements.update(RequestCall, {"pk": call_pk}, {"output": output, "is_error": is_error})


def record_requirement(row: ApprovalRequest, rule: Rule) -> RequestRequirement:
    """The rule's requirements, copied onto the new pending request (in the halt's
    transaction), with when it escalates; a route rule's request is routed from the start
    to its person or group (as a reassign escalation routes it)."""
    after = rule.escalate_after_minutes if rule.escalate_action else None
    route = rule.effect == Rule.Effect.ROUTE
    requirement = RequestRequirement(
        request=row,
        rule=rule,
        rule_version=rule.version,
        approvals_needed=max(1, rule.approvals_needed),
        approver_group_id=rule.approver_group_id,
        starter_may_not_approve=rule.starter_may_not_approve,
        escalate_at=timezone.now() + timedelta(minutes=after) if after else None,
        escalate_action=rule.escalate_action if after else "",
        escalate_group_id=rule.escalate_group_id,
        escalate_user_id=rule.escalate_user_id,
        escalate_reason=rule.escalate_reason,
        routed_user_id=rule.route_user_id if route else None,
        routed_group_id=rule.route_group_id if route and rule.route_user_id is None else None,
    )
    statements.insert([requirement])
    statements.update(ApprovalRequest, {"pk": row.pk}, {"has_requirement": True})
    row.has_requirement = True
    Rule.objects.filter(pk=rule.pk).update(
        match_count=F("match_count") + 1, last_matched_at=timezone.now()
    )
    return requirement
