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
import dataclasses
import inspect
import json
import logging
import re
import time
import uuid
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import close_old_connections, connection, transaction
from django_tasks import task

from toolnexus import (
    HALT,
    Answer,
    RunResult,
    Tool,
    ToolContext,
    ToolResult,
    create_toolkit,
    pending_of,
)
from toolnexus.agents import current_handle
from toolnexus.dialects import ANTHROPIC, OPENAI
from toolnexus.mcp import McpServer
from toolnexus.relay import RelayResult, answer_declined, relay_answer

from .. import agents, events, metrics
from ..domain.exceptions import LeaseLost
from ..domain.jsonvalues import holds_cut
from ..domain.records import set_run_status
from ..models import ApprovalRequest, RequestCall, Run, ToolExecution
from ..telemetry import logs, tracing
from . import clients, elicitations, journal, rules, store, streaming, taskrow, teams
from .identity import current_worker_id

log = logging.getLogger(__name__)

RunStatus = Run.Status

UNKNOWN_OUTCOME = (
    "the worker stopped while {name} was running, so its outcome is unknown; it was not run again"
)


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
    step: _Step | None = None
    try:
        agent = agents.require(run.agent)
        answer = _answer_for(run, agent, request) if request is not None else None
        servers = agent.mcp_servers_for(run)  # host code may read the database: not async
        step = _Step(run_id, worker_id, request.pk if request is not None else None)
        decider = rules.RuleDecider(run, worker_id, lambda call: _run_inline(agent, call, step))
        try:
            result = async_to_sync(_drive)(run, agent, step, request, answer, servers, decider)
        except _StepWriteFailed as failed:
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


@dataclasses.dataclass
class _Step:
    """One step's transcript between the engine's hooks and the database.

    The transcript is stored before anything with an effect runs (a tool the journal
    records), and with the step's end (its outcome, or its failure). A model call is not
    such an effect: a worker killed during one leaves the transcript of before it, and the
    run is driven from there again (the model is asked again; the journal keeps every tool
    from running twice, and a decision not yet marked applied is applied again from its
    stored answer). So a step that only calls the model and halts or ends writes once.
    """

    run_id: int
    worker_id: str
    applied_pk: int | None  # the decided request to mark applied with the next stored transcript
    unsaved: list[dict[str, Any]] | None = None  # the newest transcript, not stored yet
    turn_index: int = -1  # where the newest assistant turn sits (a rule-run call's journal key)

    def store_unsaved(self) -> None:
        """Store the newest transcript now (before a tool runs)."""
        if self.unsaved is None:
            return
        store.run_checkpoint(
            run_id=self.run_id,
            worker_id=self.worker_id,
            messages=self.unsaved,
            applied_request_pk=self.applied_pk,
        )
        self.unsaved, self.applied_pk = None, None


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
            output, is_error, last_result = _run_executor(
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


def _run_inline(agent: agents.Agent, call: RequestCall, step: _Step) -> tuple[str, bool]:
    """A relay call a rule approved: its executor runs now, journaled under the turn that
    called it, the transcript stored first (as before any tool)."""
    step.store_unsaved()
    output, is_error, _ = _run_executor(
        call.request.run, agent, call, step.turn_index, defer_finish=False
    )
    return output, is_error


def _halted_message_index(run: Run) -> int:
    """Where the halted assistant turn sits in the transcript (either provider's shape)."""
    for dialect in (OPENAI, ANTHROPIC):
        found = dialect.halted_turn(run.messages)
        if found is not None:
            return found[0]
    return -1


def _model_input(call: RequestCall) -> dict[str, Any]:
    """The arguments the model gave: the stored input, or, where it was cut for being nested
    too deep to store (jsonvalues.cut_deep), the whole value from the raw arguments."""
    if not holds_cut(call.input):
        return call.input
    try:
        whole = json.loads(call.arguments)
    except (ValueError, RecursionError):
        return call.input
    return whole if isinstance(whole, dict) else call.input


def _run_executor(
    run: Run,
    agent: agents.Agent,
    call: RequestCall,
    message_index: int,
    *,
    defer_finish: bool,
    handle: str = "",
) -> tuple[str, bool, dict[str, Any] | None]:
    """Run an approved relay call's executor once (the journal remembers it): its output,
    whether it is an error, and, with `defer_finish`, the journal entry still to finish
    (None when nothing is left to write)."""
    executor = agent.executor_for(call.tool_name)
    args = call.edited_input if call.edited_input is not None else _model_input(call)
    if executor is None:
        output = f"no executor is registered for {call.tool_name}"
        store.request_call_store_output(call_pk=call.pk, output=output, is_error=True)
        return output, True, None
    earlier = journal.execution_begin(
        run_id=run.pk,
        handle=handle,
        message_index=message_index,
        call_id=call.call_id,
        tool_name=call.tool_name,
        input=args,
    )
    if earlier is not None:
        output, is_error = _remembered(earlier)
        store.request_call_store_output(call_pk=call.pk, output=output, is_error=is_error)
        return output, is_error, None
    try:
        out = executor(dict(args))
        if inspect.isawaitable(out):
            out = async_to_sync(_await)(out)
        output, is_error = (
            (out.output, out.is_error) if isinstance(out, ToolResult) else (str(out), False)
        )
    except Exception as exc:
        output, is_error = f"{call.tool_name} failed: {type(exc).__name__}: {exc}", True
    finish = {
        "run_id": run.pk,
        "handle": handle,
        "message_index": message_index,
        "call_id": call.call_id,
        "output": output,
        "is_error": is_error,
        "request_call_pk": call.pk,
    }
    if defer_finish:
        return output, is_error, finish
    journal.execution_finish(**finish)
    return output, is_error, None


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _remembered(execution: ToolExecution) -> tuple[str, bool]:
    if execution.finished_at is None:
        return UNKNOWN_OUTCOME.format(name=execution.tool_name), True
    return execution.output, execution.is_error


class _StepWriteFailed(BaseException):
    """A write of the step's own (the transcript, the journal) failed inside a tool call.

    The engine turns a tool's `Exception` into a tool error the model reads; a lost lease or
    a dropped database connection is no tool failure, so it travels as a BaseException
    through the engine and `drive` handles the original as if the step had raised it.
    """

    def __init__(self, original: Exception) -> None:
        super().__init__(str(original))
        self.original = original


async def _step_write(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await sync_to_async(fn)(*args, **kwargs)
    except Exception as exc:
        raise _StepWriteFailed(exc) from exc


def _begin_execution(step: _Step, **entry: Any) -> ToolExecution | None:
    """Before a tool runs: the transcript that called it, then its journal entry."""
    step.store_unsaved()
    return journal.execution_begin(**entry)


def _journaled(tool: Tool, step: _Step, journal_name: str | None = None) -> Tool:
    """Wrap a tool so each real execution is recorded by call id before and after it runs
    (under `journal_name`, default the tool's name), the transcript stored before it runs.

    Sync tool functions run in the worker's own thread (Django's ORM is sync-only), async
    ones on the engine's loop.
    """
    inner = tool.execute
    sync_inner = (
        sync_to_async(inner, thread_sensitive=True)
        if not inspect.iscoroutinefunction(inner)
        else None
    )

    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        call_id, index = ctx.call_id, ctx.message_index
        if not call_id or index is None:
            return await _invoke(args, ctx)
        handle = current_handle() or ""  # a team run's agent: its own transcript's keys
        earlier = await _step_write(
            _begin_execution,
            step,
            run_id=step.run_id,
            handle=handle,
            message_index=index,
            call_id=call_id,
            tool_name=journal_name or tool.name,
            input=args,
        )
        if earlier is not None:
            output, is_error = _remembered(earlier)
            return ToolResult(output, is_error=is_error)
        try:
            result = await _invoke(args, ctx)
        except Exception as exc:
            result = ToolResult(
                f"tool {tool.name} failed: {type(exc).__name__}: {exc}", is_error=True
            )
        if pending_of(result) is not None:  # it suspended: nothing ran, nothing to remember
            await _step_write(
                journal.execution_discard,
                run_id=step.run_id,
                handle=handle,
                message_index=index,
                call_id=call_id,
            )
        else:
            await _step_write(
                journal.execution_finish,
                run_id=step.run_id,
                handle=handle,
                message_index=index,
                call_id=call_id,
                output=result.output,
                is_error=result.is_error,
            )
        return result

    async def _invoke(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        out = await sync_inner(args, ctx) if sync_inner is not None else inner(args, ctx)
        if inspect.isawaitable(
            out
        ):  # a sync wrapper (like the approval gate) may hand back a coroutine
            out = await out
        return ToolResult(out) if isinstance(out, str) else out

    return Tool(tool.name, tool.description, tool.input_schema, tool.source, execute)


def _prepare_tools(agent: agents.Agent, step: _Step) -> list[Tool]:
    # Relay tools and builtins only suspend or echo answers: nothing to journal.
    return [
        t if t.source in ("relay", "builtin") or t.execute is None else _journaled(t, step)
        for t in agent.build_tools()
    ]


def _mcp_origins(toolkit: Any) -> dict[str, str]:
    """Each name an MCP tool may be offered under, with its server's name: its own
    (sanitized) name, or `<server>__<name>` when the engine namespaced it."""
    origins: dict[str, str] = {}
    for server, status in toolkit.mcp_status().items():
        label = _SAFE.sub("_", server)
        for listed in status.get("tools") or []:
            base = _SAFE.sub("_", listed)[:64] or "_"
            origins.setdefault(f"{label}__{base}"[:64], server)
            origins.setdefault(base, server)
    return origins


_SAFE = re.compile(r"[^a-zA-Z0-9_-]")


async def _open_toolkit(agent: agents.Agent, step: _Step, servers: list[McpServer]) -> Any:
    """The step's toolkit: the agent's tools and its MCP servers' (started now), each real
    execution journaled. A server that does not start never fails the step: its tools are
    left out and a call to one of them (a halted call resumed) is a tool error naming the
    server and why, which the model reads (every server is opened as not `required`)."""
    toolkit = await create_toolkit(
        builtins=False,
        extra_tools=_prepare_tools(agent, step),
        mcp_servers=[dataclasses.replace(s, required=False) for s in servers] or None,
    )
    if not servers:
        return toolkit
    try:
        origins = _mcp_origins(toolkit)
        toolkit.register(
            *(
                _journaled(
                    t,
                    step,
                    agents.mcp_tool_label(origins[t.name], t.name) if t.name in origins else None,
                )
                for t in toolkit.tools()
                if t.source == "mcp"
            )
        )
    except BaseException:
        await toolkit.aclose()  # the servers it started
        raise
    return toolkit


async def _drive(
    run: Run,
    agent: agents.Agent,
    step: _Step,
    request: ApprovalRequest | None,
    answer: Answer | None,
    servers: list[McpServer] | None = None,
    decider: rules.RuleDecider | None = None,
) -> RunResult:
    reply = streaming.reply_stream_for(run.pk, agent.team)  # the reply, live on its page

    async def checkpoint(info: dict[str, Any]) -> None:
        # After each model reply and each turn: the newest transcript, stored before a tool
        # runs or with the step's end (see _Step), never for a reply or turn on its own.
        step.unsaved = list(info["messages"])
        if "response" in info:  # a model reply: the turn whose calls settle next
            step.turn_index = len(step.unsaved) - 1
            if reply is not None:
                reply.end_turn()

    async def wait_for(pending_request: Any) -> Any:
        # A rule decides the call inline, or the turn halts on it as without rules.
        decided = await _step_write(decider.decide, pending_request)
        return decided if decided is not None else HALT

    toolkit = await _open_toolkit(agent, step, servers or [])
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
            return await teams.drive(run, agent, client, toolkit, request, answer)
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
