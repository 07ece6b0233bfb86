"""Telling an MCP server how its question ended when the run will not resume.

A run halted on an MCP server's question (a request of kind "elicitation") carries the answer
to the server itself: the resumed step replays the call and the server hears `accept`,
`decline` or `cancel` (expiry). A cancelled run never resumes, so `run_cancel` queues
`tell_server` in its own transaction: the task row commits with the cancel or not at all, so
a worker that crashes after the cancel leaves the task to the next one, and the cancel never
waits for a server. The task starts that server alone, replays the call and answers its
question `cancel` (or the stored refusal: `decline` for a reviewer's decline), then stops it
(`toolnexus.mcp.answer_elicitation`); no model reads what the tool then returns. The outcome
is in the request's audit trail (`mcp_server_told`), which also keeps a second run of the task
from telling the server again.

A run cancelled while a step runs may see that step halt on a new question it can no longer
store (the run is not the step's any more): no request exists to queue `tell_server` for, so
the worker queues `tell_unstored_server` with the question itself, recorded on the run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction
from django_tasks import task

from toolnexus import Answer, Request, ToolResult
from toolnexus.mcp import ELICITATION_KIND, answer_elicitation, elicit_action
from toolnexus.relay import answer_declined

from .. import agents, events
from ..domain.records import MCP_SERVER_TOLD, append_event
from ..models import ApprovalRequest, Run

log = logging.getLogger(__name__)

# Bounds starting the server and the replayed call together (the call only has to reach
# the question again).
TELL_TIMEOUT = 300.0


@task()
def tell_server(request_pk: int) -> str:
    """The task: give the server of a cancelled run's question `cancel`; safe to run again."""
    return tell(request_pk)


def enqueue_tell(row: ApprovalRequest) -> None:
    """Queue `tell_server` for `row` (inside the transaction that cancels its run)."""
    tell_server.enqueue(row.pk)


def refusal_for(row: ApprovalRequest) -> Answer:
    """What the server hears for a run that will not resume: the stored refusal, or
    `cancel` (an accepted answer is never acted on once the run is cancelled)."""
    stored = Answer.from_dict(row.answer) if row.answer else None
    if stored is not None and not stored.ok:
        return stored
    return answer_declined(row.request_id, "cancelled")


def tell(request_pk: int) -> str:
    row = ApprovalRequest.objects.select_related("run").filter(pk=request_pk).first()
    if row is None or row.kind != ELICITATION_KIND or row.run.status != Run.Status.CANCELLED:
        return "skipped"
    if row.events.filter(action=MCP_SERVER_TOLD).exists():
        return "already told"
    answer = refusal_for(row)
    result = _ask_server(row.run, row.to_engine(), answer)
    return _record(row.run, row, row.to_engine(), answer, result)


@task()
def tell_unstored_server(run_id: int, request: dict[str, Any]) -> str:
    """The task: `tell_unstored` for a question the run could not store."""
    return tell_unstored(run_id, Request.from_dict(request))


def enqueue_tell_unstored(run_id: int, request: Request) -> None:
    """Queue `tell_unstored_server`: starting a server and replaying its call may take up to
    TELL_TIMEOUT, which the worker's step must not wait for."""
    tell_unstored_server.enqueue(run_id, request.to_dict())


def tell_unstored(run_id: int, request: Request) -> str:
    """A step halted on a server's question (the server's call cancelled at the halt) but
    could not store it: the run was cancelled meanwhile, so no request row exists for
    `run_cancel` to queue `tell` with. Tell the server `cancel`, recorded on the run
    (`detail.request_id`, which also keeps a second run of the task from telling it again)."""
    if request.kind != ELICITATION_KIND:
        return "skipped"
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.status != Run.Status.CANCELLED:
        return "skipped"  # e.g. another worker took the run over: it asks the question again
    if run.events.filter(action=MCP_SERVER_TOLD, detail__request_id=request.id).exists():
        return "already told"
    answer = answer_declined(request.id, "cancelled")
    return _record(run, None, request, answer, _ask_server(run, request, answer))


def _ask_server(run: Run, request: Request, answer: Answer) -> ToolResult:
    """Start the run's servers for the question's call, give it `answer`: the tool's result
    (an error result when that fails: recorded, never raised)."""
    agent = agents.get(run.agent)
    if agent is None:
        return ToolResult(f"no agent named {run.agent!r} is registered", is_error=True)
    try:
        return async_to_sync(_tell)(agent.mcp_servers_for(run), request, answer)
    except Exception as exc:  # recorded; the worker carries on
        log.exception("telling the MCP server of run %s's question %s failed", run.pk, request.id)
        return ToolResult(f"{type(exc).__name__}: {exc}", is_error=True)


def _record(
    run: Run, row: ApprovalRequest | None, request: Request, answer: Answer, result: ToolResult
) -> str:
    told = elicit_action(answer)  # the engine's rule: what the server was just given
    extra = {} if row is not None else {"request_id": request.id}
    with transaction.atomic():
        append_event(
            run,
            MCP_SERVER_TOLD,
            request=row,
            server=(request.data or {}).get("server", ""),
            told=told,
            output=result.output[:2000],
            is_error=result.is_error,
            **extra,
        )
        events.announce(run_id=run.pk, request_pk=row.pk if row is not None else None)
    return told


async def _tell(servers: Any, request: Any, answer: Answer) -> ToolResult:
    try:
        return await asyncio.wait_for(answer_elicitation(servers, request, answer), TELL_TIMEOUT)
    except TimeoutError:
        return ToolResult(f"no answer within {TELL_TIMEOUT:g}s", is_error=True)
