"""Runs as people start, retry and cancel them (permission, per-agent access and the
start rate checked here)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, Min
from django.utils import timezone

from toolnexus.mcp import ELICITATION_KIND
from toolnexus.relay import answer_declined

from .. import agents, events
from ..conf import app_settings
from ..domain import statements
from ..domain.exceptions import InvalidInput, InvalidTransition, ServiceError
from ..domain.records import append_event, record_decision, set_run_status
from ..execution.elicitations import enqueue_tell
from ..execution.runner import enqueue
from ..models import ApprovalRequest, Event, Run
from ..permissions import (
    DECIDE_PERMISSION,
    START_PERMISSION,
    can_view_agent,
    require,
    require_decide_run,
    require_visible,
)

RunStatus = Run.Status
State = ApprovalRequest.State

MAX_PROMPT_CHARS = 20_000
RATE_WINDOW = timedelta(minutes=1)


class TooManyRuns(ServiceError):
    """The user started TOOLNEXUS_RUNS_PER_MINUTE runs in the last minute (429)."""

    status = 429

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


def check_start_rate(user: Any) -> None:
    """TooManyRuns once `user` started TOOLNEXUS_RUNS_PER_MINUTE runs in the last minute
    (counted from the runs table, so every process sees the same count)."""
    cap = int(app_settings.RUNS_PER_MINUTE or 0)
    if cap <= 0 or not getattr(user, "is_authenticated", False):
        return
    now = timezone.now()
    recent = Run.objects.filter(started_by=user, created_at__gt=now - RATE_WINDOW).aggregate(
        n=Count("id"), oldest=Min("created_at")
    )
    if recent["n"] < cap:
        return
    wait = max(1, math.ceil((recent["oldest"] + RATE_WINDOW - now).total_seconds()))
    raise TooManyRuns(
        f"too many runs: you started {recent['n']} in the last minute and the limit is {cap};"
        f" try again in {wait} s",
        retry_after=wait,
    )


def run_start(
    *,
    agent: str,
    prompt: str,
    started_by: Any = None,
    check_permission: bool = True,
    rate_limited: bool = False,
) -> Run:
    """Start a run. Entry points people use (the API, the start page) pass
    `rate_limited=True`: the per-user cap on starts applies (TooManyRuns, 429)."""
    if check_permission:
        require(started_by, START_PERMISSION, "start runs")
    registered = agents.get(agent) if isinstance(agent, str) else None
    # An agent hidden from the starter reads as one that does not exist: the answer must not
    # tell an outsider which agent names are registered.
    if registered is None or (check_permission and not can_view_agent(started_by, registered.name)):
        raise InvalidInput(f"agent: no agent named {agent!r} is registered")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInput("prompt: must be a non-empty string")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidInput(f"prompt: must be at most {MAX_PROMPT_CHARS} characters")
    if rate_limited:
        check_start_rate(started_by)
    with transaction.atomic():
        run = Run(
            agent=registered.name,
            prompt=prompt,
            system_prompt=registered.system_prompt,
            started_by=started_by if getattr(started_by, "is_authenticated", False) else None,
        )
        statements.insert([run], keys=True)
        trail: list[Event] = []
        append_event(
            run,
            "run_started",
            actor=started_by,
            to_state=run.status,
            into=trail,
            agent=run.agent,
        )
        statements.insert(trail)
        enqueue(run.pk)
        events.announce(run_id=run.pk)
    return run


def run_retry(*, run_id: int, user: Any) -> Run:
    """Queue a failed run again; it resumes from its stored transcript and decisions."""
    require(user, START_PERMISSION, "retry runs")
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        require_visible(user, run)
        if run.status != RunStatus.FAILED:
            # Only a failure is retried: a pending run waits for a person, not a worker.
            raise InvalidTransition(
                f"run {run.pk} is {run.status}: only a failed run can be retried"
            )
        set_run_status(
            run, RunStatus.QUEUED, actor=user, action="run_retried", previous_error=run.error[:500]
        )
        run.error = ""
        run.finished_at = None
        run.save()
        enqueue(run.pk)
        events.announce(run_id=run.pk)
    return run


FOLLOW_UP = "run_followed_up"  # the audit action; its detail: message


def run_follow_up(*, run_id: int, user: Any, message: Any) -> Run:
    """Continue a finished run (done, or stopped at its turn limit) with a new user message:
    the same agent, the transcript kept, queued to run again (it may halt again). Whoever
    may start runs and see the agent may; the audit trail says who asked what."""
    require(user, START_PERMISSION, "continue runs")
    if not isinstance(message, str) or not message.strip():
        raise InvalidInput("message: must be a non-empty string")
    if len(message) > MAX_PROMPT_CHARS:
        raise InvalidInput(f"message: must be at most {MAX_PROMPT_CHARS} characters")
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        require_visible(user, run)
        registered = agents.get(run.agent)
        if registered is None:
            raise InvalidInput(f"agent: {run.agent!r} is no longer registered")
        if run.status not in (RunStatus.DONE, RunStatus.INCOMPLETE):
            raise InvalidTransition(
                f"run {run.pk} is {run.status}: only a finished run (done, or stopped at its"
                " turn limit) takes a follow-up"
            )
        # The same shape in both dialects the engine speaks. A team run's transcript is its
        # coordinator's: the worker hands the message to it (execution.teams).
        run.messages = [*run.messages, {"role": "user", "content": message}]
        set_run_status(run, RunStatus.QUEUED, actor=user, action=FOLLOW_UP, message=message)
        run.text = ""
        run.finished_at = None
        run.save()
        enqueue(run.pk)
        events.announce(run_id=run.pk)
    return run


def run_cancel(*, run_id: int, user: Any, reason: str = "") -> Run:
    """Stop a run for good; its open request (if any) is cancelled with it. When the run waits
    on an MCP server's question (open, or decided but not yet carried to the server), a task
    queued in the same transaction tells that server `cancel` (`execution.elicitations`)."""
    require(user, DECIDE_PERMISSION, "cancel runs")
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        require_decide_run(user, run)
        open_request = (
            ApprovalRequest.objects.select_for_update().filter(run=run, state=State.PENDING).first()
        )
        if open_request is not None:
            record_decision(
                open_request,
                user,
                State.CANCELLED,
                answer_declined(open_request.request_id, "cancelled"),
                reason or "cancelled",
                resume=False,
            )
        unanswered = _unanswered_elicitation(run, open_request)
        set_run_status(run, RunStatus.CANCELLED, actor=user, action="run_cancelled", reason=reason)
        run.worker_id = ""
        run.lease_expires_at = None
        run.finished_at = timezone.now()
        run.save()
        if unanswered is not None:
            enqueue_tell(unanswered)
        events.announce(run_id=run.pk, request_pk=open_request.pk if open_request else None)
    return run


def _unanswered_elicitation(run: Run, open_request: ApprovalRequest | None) -> Any:
    """The MCP server's question whose server has not heard how it ended: the open one, or
    one decided while no worker holds the run (queued or failed) and not yet applied."""
    if open_request is not None:
        return open_request if open_request.kind == ELICITATION_KIND else None
    if run.status not in (RunStatus.QUEUED, RunStatus.FAILED):
        return None  # a running step carries its decided request to the server itself
    return (
        run.requests.filter(kind=ELICITATION_KIND, applied_at__isnull=True)
        .exclude(state=State.PENDING)
        .order_by("-created_at", "-id")
        .first()
    )
