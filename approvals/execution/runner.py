"""The bridge between stored runs and the engine: the only module that drives `toolnexus`.

`execute_run` is what a worker task calls. It claims the run, works out where the run
stands from the database alone (nothing is kept in process memory between steps), drives the
engine, checkpoints the transcript after every step, and stores the outcome. It is safe to
call again for the same run after a crash at any point:

- tools the engine runs are journaled by (transcript position, call id) before they run, so
  a re-driven turn reuses their results instead of running them twice;
- relay executors are journaled the same way before the answer is built;
- a decided request is applied with `run_with_answer` until a checkpoint marks it applied;
  after that, an interrupted run carries on with `continue_run`.

The agent's MCP servers are connected for each step and closed at its end: nothing of a
connection outlives a step, so a run halted on a server's question (kind "elicitation")
resumes in any worker, the call replayed with the stored answer. A server that does not
start is a tool error for the model, never a failed step. MCP tools are journaled
like the agent's own, under "<server> · <tool>" (the record shows where a call ran).

The engine runs through `async_to_sync`: in a worker, on the worker process's one event loop
(see worker.py), with the agent's model client kept for that loop (clients.py).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from django.db import close_old_connections, connection, transaction
from django_tasks import task

from toolnexus import (
    HALT,
    Answer,
    RunResult,
)
from toolnexus.agents import current_handle
from toolnexus.dialects import ANTHROPIC, OPENAI
from toolnexus.mcp import McpServer
from toolnexus.relay import RelayResult, answer_declined, relay_answer

from .. import agents, events, metrics
from ..domain.exceptions import LeaseLost
from ..domain.records import set_run_status
from ..models import ApprovalRequest, RequestCall, Run
from ..telemetry import logs, tracing
from . import clients, elicitations, journal, rules, store, streaming, taskrow, teams
from .identity import current_worker_id
from .tool_runs import (  # noqa: F401  (UNKNOWN_OUTCOME: what the record says)
    UNKNOWN_OUTCOME,
    Step,
    StepWriteFailed,
    open_toolkit,
    run_executor,
    run_inline,
    step_write,
)

log = logging.getLogger(__name__)

RunStatus = Run.Status


@task()
def execute_run(run_id: int, traceparent: str = "") -> str:
    """The task: drive a run to its next stop; safe to run again for the same run.
    `traceparent`: the trace of what queued it (a decision's web request), continued here."""
    with tracing.continued(traceparent):
        return drive(run_id)


def enqueue(run_id: int, *, request_id: str = "") -> None:
    """Queue the run's execution (call inside the transaction that made it runnable: the task
    row commits with it, or not at all). With tracing on, the task carries the trace it was
    queued in (`request_id`: the decided request, for the span)."""
    traceparent = tracing.enqueue_context(run_id=run_id, request_id=request_id)
    if traceparent:
        execute_run.enqueue(run_id, traceparent=traceparent)
    else:  # the same arguments as ever: tasks queued by another version still match
        execute_run.enqueue(run_id)


def _claim_step(
    run_id: int, traceparent: str = ""
) -> tuple[str, tuple[Run, ApprovalRequest | None] | None]:
    """Claim the run for a new execution of this worker: (its holder id, the run and the
    decided request the step starts from, or None when the run is not ours to take)."""
    worker_id = f"{current_worker_id()}:{uuid.uuid4().hex[:12]}"
    return worker_id, store.run_claim_step(run_id=run_id, worker_id=worker_id)


def _release_step(claimed: tuple[str, Any]) -> None:
    """A claim whose task never started: stop renewing its lease; the run's lease lapses and
    maintenance queues it again."""
    worker_id, step = claimed
    if step is not None:
        store.forget_run(worker_id)


# A worker claims the run in the same transaction as the task row (execution.taskrow).
taskrow.claim_with_task(execute_run, claim=_claim_step, release=_release_step)


def drive(run_id: int) -> str:
    """Claim and drive a run to its next stop (done, pending, incomplete or failed)."""
    # One transaction: the claim, and the decided request the step starts from (in a
    # worker, the transaction that claimed the task row).
    worker_id, claimed = taskrow.claimed_with_task() or _claim_step(run_id)
    if claimed is None:
        return "skipped"  # already taken, finished or cancelled
    run, request = claimed
    request_id = request.request_id if request is not None else ""
    # Every log line of the step names the run, and for a resume the request and who decided
    # it, by id (their name would cost a query per step).
    decider_id = request.decided_by_id if request is not None else None
    with (
        logs.bound(run_id=run_id, request_id=request_id, user_id=decider_id),
        tracing.span(
            "toolnexus.resume" if request is not None else "toolnexus.step",
            run_id=run_id,
            request_id=request_id,
        ) as span,
    ):
        if request is None:
            outcome = _drive_claimed(run_id, worker_id, run, request)
        else:
            # A step from a decided request: a resume (counted for the metrics).
            metrics.resume_started(agent=run.agent)
            outcome = "failed"
            try:
                outcome = _drive_claimed(run_id, worker_id, run, request)
            finally:
                metrics.resume_ended(agent=run.agent, outcome=outcome)
        if span is not None:
            span.set_attribute("toolnexus.outcome", outcome)
        log.info("run %s: step ended %s", run_id, outcome)
        return outcome


def _drive_claimed(run_id: int, worker_id: str, run: Run, request: ApprovalRequest | None) -> str:
    step: Step | None = None
    try:
        agent = agents.require(run.agent)
        answer = _answer_for(run, agent, request) if request is not None else None
        servers = agent.mcp_servers_for(run)  # host code may read the database: not async
        step = Step(run_id, worker_id, request.pk if request is not None else None)
        decider = rules.RuleDecider(run, worker_id, lambda call: run_inline(agent, call, step))
        try:
            result = async_to_sync(_drive)(run, agent, step, request, answer, servers, decider)
        except StepWriteFailed as failed:
            raise failed.original from None
    except LeaseLost as exc:
        log.warning("%s", exc)
        return "lease lost"
    except asyncio.CancelledError:
        # The worker's loop cancelled the step (`serve` shutting down): not a failure of
        # the run, which goes back to the queue from its last checkpoint.
        log.warning("run %s: its worker stopped mid-step; queueing it again", run_id)
        requeue = lambda: run_requeue(  # noqa: E731
            run_id=run_id, worker_id=worker_id, reason="its worker stopped"
        )
        return _settle_safely(run_id, worker_id, requeue, "requeued")
    except Exception as exc:  # the run records every failure; the worker carries on
        log.exception("run %s failed", run_id)
        error = f"{type(exc).__name__}: {exc}"
        # The failed run keeps the transcript it got to (a decision applied to it included).
        fail = lambda: store.run_fail(  # noqa: E731
            run_id=run_id,
            worker_id=worker_id,
            error=error,
            messages=step.unsaved if step is not None else None,
            applied_request_pk=step.applied_pk if step is not None else None,
        )
        return _settle_safely(run_id, worker_id, fail, "failed")
    _keep_field_order(result)
    write = lambda: store.run_store_result(  # noqa: E731
        run=run,
        worker_id=worker_id,
        result=result,
        applied_request_pk=step.applied_pk,
        team_state=getattr(result, "team_state", None),  # a team run's (teams.py)
        requirement=decider.requirement_for(result.pending),
    )
    outcome = _settle_safely(run_id, worker_id, write, result.status)
    if outcome == "lease lost" and result.pending is not None:
        # Halted on an MCP server's question the run (cancelled meanwhile) never stored:
        # nothing else will tell that server how its question ended.
        elicitations.enqueue_tell_unstored(run_id, result.pending)
    return outcome


def _keep_field_order(result: RunResult) -> None:
    """A form's schema (an MCP server's question, an input request) is stored as JSON, whose
    objects PostgreSQL does not keep in order: the order its fields were asked in is kept
    beside it, as `data.fieldOrder`, for the form reviewers fill."""
    data = result.pending.data if result.pending is not None else None
    schema = data.get("schema") if isinstance(data, dict) else None
    props = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(props, dict) and props and "fieldOrder" not in data:
        data["fieldOrder"] = list(props)


def _settle_safely(run_id: int, worker_id: str, write, outcome: str) -> str:
    """Write a run's outcome; if the database fails under us (a dropped connection), hand
    the run back to the queue from its last checkpoint instead of leaving it held by this
    worker, whose heartbeat would keep its lease alive forever."""
    try:
        write()
        return outcome
    except LeaseLost as exc:
        log.warning("%s", exc)
        return "lease lost"
    except Exception:
        log.exception("storing the outcome of run %s failed; queueing it again", run_id)
    for attempt in range(3):
        close_old_connections()
        connection.close()  # a broken connection reconnects on the next query
        try:
            run_requeue(run_id=run_id, worker_id=worker_id, reason="storing its outcome failed")
            return "requeued"
        except LeaseLost:
            return "lease lost"
        except Exception:
            log.exception("queueing run %s again failed (attempt %s)", run_id, attempt + 1)
            time.sleep(0.5 * (attempt + 1))
    # Still no database: stop renewing this run's lease so that another worker takes it over.
    store.forget_run(worker_id)
    return "abandoned"


def run_requeue(*, run_id: int, worker_id: str, reason: str) -> None:
    """Give a run held by this worker back to the queue; it continues from its checkpoint."""
    with transaction.atomic():
        run = store.locked_own_run(run_id, worker_id)
        set_run_status(
            run, RunStatus.QUEUED, action="run_requeued", reason=reason, worker=worker_id
        )
        run.worker_id = ""
        run.lease_expires_at = None
        run.save()
        enqueue(run.pk)
        events.announce(run_id=run.pk, status_only=True)


def _answer_for(run: Run, agent: agents.Agent, request: ApprovalRequest) -> Answer:
    """The decision as an engine Answer; approved relay calls run their executors first."""
    if request.answer is not None:
        return Answer.from_dict(request.answer)
    # A team run's executors are journaled under the asking agent's handle and transcript.
    handle, message_index = (
        teams.halted_position(run) if agent.team else ("", _halted_message_index(run))
    )
    calls = request.call_list()
    approved = [
        c for c in calls if c.decision in (RequestCall.Decision.APPROVE, RequestCall.Decision.EDIT)
    ]
    results = []
    last_result: dict[str, Any] | None = None  # journaled together with the answer
    for call in calls:
        if call in approved:
            # Each result goes to the journal and to the call's row in one transaction; the
            # last executor's result waits for the answer built from it, to share its commit
            # (a worker killed before that commit leaves an unknown outcome, as it would
            # have between the executor and its journal entry).
            output, is_error, last_result = run_executor(
                run, agent, call, message_index, defer_finish=call is approved[-1], handle=handle
            )
        else:
            output, is_error = call.output or "", call.is_error
        results.append(RelayResult(call.call_id, output, is_error))
    answer = (
        relay_answer(request.request_id, results)
        if results
        else answer_declined(request.request_id, "no calls")
    )
    keep = lambda: store.request_store_answer(request_pk=request.pk, answer=answer)  # noqa: E731
    if last_result is not None:
        journal.execution_finish(**last_result, then=keep)
    else:
        keep()
    return answer


def _halted_message_index(run: Run) -> int:
    """Where the halted assistant turn sits in the transcript (either provider's shape)."""
    for dialect in (OPENAI, ANTHROPIC):
        found = dialect.halted_turn(run.messages)
        if found is not None:
            return found[0]
    return -1


async def _drive(
    run: Run,
    agent: agents.Agent,
    step: Step,
    request: ApprovalRequest | None,
    answer: Answer | None,
    servers: list[McpServer] | None = None,
    decider: rules.RuleDecider | None = None,
) -> RunResult:
    reply = streaming.reply_stream_for(run.pk, agent.team)  # the reply, live on its page

    async def checkpoint(info: dict[str, Any]) -> None:
        # After each model reply and each turn: the newest transcript, stored before a tool
        # runs or with the step's end (see Step), never for a reply or turn on its own.
        step.unsaved = list(info["messages"])
        if "response" in info:  # a model reply: the turn whose calls settle next
            step.turn_index = len(step.unsaved) - 1
            if reply is not None:
                reply.end_turn()

    async def wait_for(pending_request: Any) -> Any:
        # A rule decides the call inline, or the turn halts on it as without rules.
        decided = await step_write(decider.decide, pending_request)
        return decided if decided is not None else HALT

    toolkit = await open_toolkit(agent, step, servers or [])
    # In a worker, the agent's client (and its connections) is kept for the worker's loop and
    # reused run after run; each run gets its own copy with its system prompt and hooks.
    async with toolkit, clients.client_for_run(agent, run.system_prompt) as client:
        # A span per model call (with tracing on): the client is this run's own (a copy).
        client.backend = tracing.traced_model(
            client.backend,
            model=client.model,
            run_id=run.pk,
            request_id=request.request_id if request is not None else "",
        )
        if agent.team:  # its state is stored with the step's outcome only (teams.py)

            async def note_turn(info: dict[str, Any]) -> None:
                # Where each agent's newest turn sits in its own transcript: the journal's
                # key for a relay call a rule approves in it. Its live reply's turn ends.
                if "response" in info:
                    step.team_turns[current_handle() or ""] = len(info["messages"]) - 1
                    if reply is not None:
                        reply.end_turn()

            client.hooks = _with_checkpoints(client.hooks, note_turn)
            if reply is not None:  # each agent's reply, live
                client.on_text = reply.add
            try:
                return await teams.drive(
                    run,
                    agent,
                    client,
                    toolkit,
                    request,
                    answer,
                    wait_for=wait_for if decider is not None else None,
                )
            finally:
                if reply is not None:
                    reply.close()
        client.hooks = _with_checkpoints(client.hooks, checkpoint)
        if decider is not None:
            client.wait_for = wait_for
        client.on_text = reply.add if reply is not None else None
        try:
            if request is not None and answer is not None:
                return await client.run_with_answer(
                    toolkit, run.messages, request.to_engine(), answer
                )
            if run.messages:
                return await client.continue_run(toolkit, run.messages)
            return await client.run(run.prompt, toolkit)
        finally:
            if reply is not None:
                reply.close()


def _with_checkpoints(hooks: Any, checkpoint: Any) -> dict[str, Any]:
    """The agent's own hooks, plus a transcript checkpoint after each model reply and turn."""
    merged: dict[str, Any] = {}
    for name in ("before_llm", "after_llm", "before_tool", "after_tool", "after_turn"):
        fn = (
            hooks.get(name)
            if isinstance(hooks, dict)
            else getattr(hooks, name, None)
            if hooks is not None
            else None
        )
        if fn is not None:
            merged[name] = fn

    def chain(name: str) -> Any:
        own = merged.get(name)

        async def hook(info: dict[str, Any]) -> Any:
            value = None
            if own is not None:
                value = own(info)
                if inspect.isawaitable(value):
                    value = await value
            await checkpoint(info)
            return value

        return hook

    merged["after_llm"] = chain("after_llm")
    merged["after_turn"] = chain("after_turn")
    return merged
