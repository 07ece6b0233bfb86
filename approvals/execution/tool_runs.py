"""How a step's tools run, each real execution journaled (journal.py) so that none runs
twice: the executors of approved relay calls (and of calls a rule approved inline), the
agent's own tools and its MCP servers' toolkits. `Step` is the step's transcript between
the engine's hooks and the database: stored before anything with an effect runs."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async

from toolnexus import Tool, ToolContext, ToolResult, create_toolkit, pending_of
from toolnexus.agents import current_handle
from toolnexus.mcp import McpServer

from .. import agents
from ..domain.jsonvalues import holds_cut
from ..models import RequestCall, Run, ToolExecution
from . import journal, store

UNKNOWN_OUTCOME = (
    "the worker stopped while {name} was running, so its outcome is unknown; it was not run again"
)


@dataclasses.dataclass
class Step:
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
    # A team run's: where each agent's newest turn sits in its own transcript, by handle.
    team_turns: dict[str, int] = dataclasses.field(default_factory=dict)

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


def run_inline(agent: agents.Agent, call: RequestCall, step: Step) -> tuple[str, bool]:
    """A relay call a rule approved: its executor runs now, journaled under the turn that
    called it, the transcript stored first (as before any tool)."""
    step.store_unsaved()
    handle = current_handle() or ""  # a team run's asking agent (its turn, its journal keys)
    index = step.team_turns.get(handle, -1) if handle else step.turn_index
    output, is_error, _ = run_executor(
        call.request.run, agent, call, index, defer_finish=False, handle=handle
    )
    return output, is_error


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


def run_executor(
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
        output, is_error = remembered(earlier)
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


def remembered(execution: ToolExecution) -> tuple[str, bool]:
    if execution.finished_at is None:
        return UNKNOWN_OUTCOME.format(name=execution.tool_name), True
    return execution.output, execution.is_error


class StepWriteFailed(BaseException):
    """A write of the step's own (the transcript, the journal) failed inside a tool call.

    The engine turns a tool's `Exception` into a tool error the model reads; a lost lease or
    a dropped database connection is no tool failure, so it travels as a BaseException
    through the engine and `drive` handles the original as if the step had raised it.
    """

    def __init__(self, original: Exception) -> None:
        super().__init__(str(original))
        self.original = original


async def step_write(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await sync_to_async(fn)(*args, **kwargs)
    except Exception as exc:
        raise StepWriteFailed(exc) from exc


def _begin_execution(step: Step, **entry: Any) -> ToolExecution | None:
    """Before a tool runs: the transcript that called it, then its journal entry."""
    step.store_unsaved()
    return journal.execution_begin(**entry)


def journaled(tool: Tool, step: Step, journal_name: str | None = None) -> Tool:
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
        earlier = await step_write(
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
            output, is_error = remembered(earlier)
            return ToolResult(output, is_error=is_error)
        try:
            result = await _invoke(args, ctx)
        except Exception as exc:
            result = ToolResult(
                f"tool {tool.name} failed: {type(exc).__name__}: {exc}", is_error=True
            )
        if pending_of(result) is not None:  # it suspended: nothing ran, nothing to remember
            await step_write(
                journal.execution_discard,
                run_id=step.run_id,
                handle=handle,
                message_index=index,
                call_id=call_id,
            )
        else:
            await step_write(
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


def prepare_tools(agent: agents.Agent, step: Step) -> list[Tool]:
    # Relay tools and builtins only suspend or echo answers: nothing to journal.
    return [
        t if t.source in ("relay", "builtin") or t.execute is None else journaled(t, step)
        for t in agent.build_tools()
    ]


def mcp_origins(toolkit: Any) -> dict[str, str]:
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


async def open_toolkit(agent: agents.Agent, step: Step, servers: list[McpServer]) -> Any:
    """The step's toolkit: the agent's tools and its MCP servers' (started now), each real
    execution journaled. A server that does not start never fails the step: its tools are
    left out and a call to one of them (a halted call resumed) is a tool error naming the
    server and why, which the model reads (every server is opened as not `required`)."""
    toolkit = await create_toolkit(
        builtins=False,
        extra_tools=prepare_tools(agent, step),
        mcp_servers=[dataclasses.replace(s, required=False) for s in servers] or None,
    )
    if not servers:
        return toolkit
    try:
        origins = mcp_origins(toolkit)
        toolkit.register(
            *(
                journaled(
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
