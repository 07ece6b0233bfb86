"""The runtime: runs handles on the loop, the `task` tool, escalation, halts and resume."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from .. import texts
from ..loop import Client, WaitFor, _maybe_await, _zero_usage
from ..toolkit import Toolkit
from ..types import (
    Answer,
    Request,
    ResumeError,
    RunCancelled,
    RunResult,
    RunTimeout,
    Tool,
    ToolContext,
    ToolResult,
)
from .state import (
    DEFAULT_MAX_DEPTH,
    ROOT,
    STATE_VERSION,
    SUBAGENT_KIND,
    Agent,
    AgentResult,
    Budget,
    ConversationStore,
    Handle,
    add_usage,
)

__all__ = ["Runtime", "current_handle"]

# The handle whose model loop is running in this context (tools it calls see it).
_CURRENT_HANDLE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "toolnexus_current_handle", default=None
)


def current_handle() -> str | None:
    """The id of the handle whose loop called the running tool (`root/coordinator.1`), or
    None outside a runtime: a host that journals tool executions keys them with it, since
    call ids and transcript positions repeat from one handle to another."""
    return _CURRENT_HANDLE.get()


_NO_TURN_CAP = 1 << 30  # the loop's own cap stays out of the way: budgets count turns


def _with_path(request: Request, handle_id: str) -> Request:
    return dataclasses.replace(request, data={**(request.data or {}), "path": handle_id.split("/")})


class Runtime:
    """Runs agents that delegate to each other (see the `toolnexus.agents` docstring).

    `client` supplies the model connection (its backend, model, hooks, timeout, `on_text`
    and, as the default turn cap, `max_turns`); each agent brings its own system prompt.
    The hooks and `on_text` run with `current_handle()` naming the agent that called them. `toolkit` holds
    the tools agents see a view of. `state` is a `to_dict()` of an earlier runtime.
    """

    def __init__(
        self,
        agents: Iterable[Agent],
        *,
        client: Client,
        toolkit: Toolkit | None = None,
        budget: Budget | None = None,
        wait_for: WaitFor | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        self.agents: dict[str, Agent] = {}
        for agent in agents:
            if agent.name in self.agents:
                raise ValueError(f"two agents are named {agent.name!r}")
            self.agents[agent.name] = agent
        self.client = client
        self.toolkit = toolkit if toolkit is not None else Toolkit()
        self.budget = budget or Budget()
        self.wait_for = wait_for
        self._views: dict[str, list[Tool]] = {}
        self._kits: dict[str, Toolkit] = {}
        for agent in self.agents.values():
            self._views[agent.name] = self._view_of(agent)
        self.conversations = ConversationStore()
        self._handles: dict[str, Handle] = {ROOT: Handle(id=ROOT, agent=None)}
        self._top: str | None = None
        if state is not None:
            self._load(state)

    def _view_of(self, agent: Agent) -> list[Tool]:
        unknown = sorted(set(agent.team) - set(self.agents))
        if unknown:
            raise ValueError(f"agent {agent.name!r} has unknown team member(s) {unknown}")
        if agent.tools is None:
            tools = self.toolkit.tools()
        else:
            missing = sorted(n for n in agent.tools if self.toolkit.get(n) is None)
            if missing:
                raise ValueError(f"agent {agent.name!r} names tools the toolkit lacks: {missing}")
            tools = [self.toolkit.get(n) for n in agent.tools]
        if agent.team and any(t.name == "task" for t in tools):
            raise ValueError(f"agent {agent.name!r} has a team and a tool named 'task'")
        return tools

    # -- public API --------------------------------------------------------------------------

    async def run(
        self, agent: str, prompt: str, *, cancel: asyncio.Event | None = None
    ) -> AgentResult:
        """Start `agent` on `prompt` as a top-level handle and run it to its end or a halt."""
        if agent not in self.agents:
            raise ValueError(f"unknown agent {agent!r} (known: {', '.join(sorted(self.agents))})")
        top = self._handles.get(self._top)
        if top is not None and top.state == "suspended":
            raise ResumeError(f"{top.id} is halted on a pending request: resume or close it first")
        spawned = self._spawn(self._handles[ROOT], agent, prompt)
        if isinstance(spawned, AgentResult):
            return spawned
        self._top = spawned.id
        await self._run(spawned, cancel)
        return self.result()

    async def resume(self, answer: Answer, *, cancel: asyncio.Event | None = None) -> AgentResult:
        """Answer the pending request: the asking handle resumes, then each parent above it."""
        asker = self._asker(self._handles.get(self._top))
        if asker is None:
            raise ResumeError("no suspended handle: nothing to resume")
        pending = Request.from_dict(asker.checkpoint["pending"])
        if answer.id != pending.id:
            raise ResumeError(
                f"answer id {answer.id!r} does not echo the pending request id {pending.id!r}"
            )
        if cancel is not None and cancel.is_set():
            # As `Client.run_with_answer` does with a set event; raised before any checkpoint
            # is touched, so the same answer can be given again.
            raise RunCancelled("run cancelled")
        # Known gap: a cancel or deadline reached while the asker runs ends it `interrupted`
        # or `timeout` with its checkpoint spent, and the levels above then resume on that
        # result (after a cancel, they end `interrupted` too); keeping the parents suspended
        # on the asker is left for later.
        outcome = await self._resume(asker, pending, answer, cancel)
        for handle in self._chain(asker)[1:-1]:  # its parents, up to the top-level handle
            if outcome.status == "pending":
                break  # the child halted again: the levels above stay suspended on it
            halt = Request.from_dict(handle.checkpoint["pending"])
            # The parent's halted `task` call runs again and re-attaches to its child.
            outcome = await self._resume(handle, halt, Answer(id=halt.id, ok=True), cancel)
        return self.result()

    async def follow_up(self, message: str, *, cancel: asyncio.Event | None = None) -> AgentResult:
        """Continue the latest top-level agent, finished, with a new user message: its own
        conversation kept (its turns and usage keep growing), its team as it was. It may halt
        again; a `task` call it repeats re-attaches to that child's recorded result."""
        if not isinstance(message, str) or not message.strip():
            raise ValueError("a follow-up needs a non-empty message")
        top = self._handles.get(self._top) if self._top is not None else None
        if top is None:
            raise ResumeError("no top-level agent has run: nothing to follow up")
        if top.state == "suspended":
            raise ResumeError(f"{top.id} is halted on a pending request: resume or close it first")
        if top.state != "idle" or top.inflight is not None:
            raise ResumeError(f"{top.id} is {top.state}: only a finished agent takes a follow-up")
        await self._run(top, cancel, prompt=message)
        return self.result()

    def result(self) -> AgentResult:
        """Where the latest top-level handle stands (pending: the asking agent's request)."""
        if self._top is None:
            raise ResumeError("nothing has run yet")
        return self._result_of(self._handles[self._top])

    @property
    def pending(self) -> Request | None:
        asker = self._asker(self._handles.get(self._top))
        return self._reported(asker) if asker is not None else None

    def handle(self, handle_id: str) -> Handle:
        return self._handles[handle_id]

    def handles(self) -> list[Handle]:
        """Every handle but the root, in the order they were started."""
        return [h for h in self._handles.values() if h.id != ROOT]

    def close(self) -> None:
        """Close every handle; a suspended one ends `closed` and nothing remains to resume."""
        for h in self.handles():
            if h.state == "closed":
                continue
            if h.state == "suspended" or h.outcome is None:
                h.outcome = {"status": "closed", "text": "closed", "limit": None, "error": None}
            h.checkpoint = None
            self._move(h, "closed")

    def to_dict(self) -> dict[str, Any]:
        """The whole runtime as plain JSON: handles, checkpoints, usage, transcripts."""
        return {
            "version": STATE_VERSION,
            "top": self._top,
            "handles": [h.to_dict() for h in self._handles.values()],
            "conversations": self.conversations.to_dict(),
        }

    def _load(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise ValueError(f"runtime state must be an object with version {STATE_VERSION}")
        handles = [Handle.from_dict(d) for d in state.get("handles") or []]
        for h in handles:
            if h.agent is not None and h.agent not in self.agents:
                raise ValueError(f"saved handle {h.id} runs unknown agent {h.agent!r}")
        self._handles = {h.id: h for h in handles}
        self._handles.setdefault(ROOT, Handle(id=ROOT, agent=None))
        self._top = state.get("top")
        self.conversations = ConversationStore(state.get("conversations") or {})

    # -- handles, budgets ----------------------------------------------------------------------

    def _move(self, h: Handle, state: str) -> None:
        h.transitions.append(f"{h.state}→{state}")
        h.state = state

    def _chain(self, h: Handle) -> list[Handle]:
        """`h` and its ancestors, nearest first, the root last."""
        out = [h]
        while out[-1].parent is not None:
            out.append(self._handles[out[-1].parent])
        return out

    def _budget(self, h: Handle) -> Budget:
        if h.agent is None:
            return self.budget
        return self.agents[h.agent].budget or Budget()

    def _max_turns(self, h: Handle) -> int:
        for value in (self._budget(h).max_turns, self.budget.max_turns):
            if value is not None:
                return value
        return self.client.max_turns

    def _spent(self, h: Handle) -> tuple[dict[str, int], int]:
        """Usage and tool calls of `h` and its descendants, runs in flight included."""
        usage, calls = _zero_usage(), 0
        stack = [h]
        while stack:
            node = stack.pop()
            add_usage(usage, node.usage)
            add_usage(usage, node.live_usage)
            calls += node.tool_calls + node.live_calls
            stack.extend(self._handles[c] for c in node.children)
        return usage, calls

    def _limited(self, h: Handle) -> list[tuple[Handle, Budget]]:
        """`h` and the ancestors whose budgets limit tokens or tool calls."""
        out = []
        for a in self._chain(h):
            b = self._budget(a)
            if b.max_tokens is not None or b.max_tool_calls is not None:
                out.append((a, b))
        return out

    def _exhausted(
        self, h: Handle, limited: list[tuple[Handle, Budget]] | None = None
    ) -> tuple[str, int] | None:
        for a, b in self._limited(h) if limited is None else limited:
            usage, calls = self._spent(a)
            if b.max_tokens is not None and usage.get("total_tokens", 0) >= b.max_tokens:
                return "maxTokens", b.max_tokens
            if b.max_tool_calls is not None and calls >= b.max_tool_calls:
                return "maxToolCalls", b.max_tool_calls
        return None

    def _spawn(self, parent: Handle, agent: str, prompt: str) -> Handle | AgentResult:
        """A new child of `parent`, or the `incomplete` result of a budget that refuses it."""
        refused = None
        own = self._budget(parent)
        if own.max_children is not None and len(parent.children) >= own.max_children:
            refused = ("maxChildren", own.max_children)
        for a in self._chain(parent):
            cap = self._budget(a).max_depth
            if cap is None and a.id == ROOT:
                cap = DEFAULT_MAX_DEPTH
            if refused is None and cap is not None and parent.depth + 1 - a.depth > cap:
                refused = ("maxDepth", cap)
        refused = refused or self._exhausted(parent)
        if refused is not None:
            limit, value = refused
            return AgentResult(
                status="incomplete",
                text=texts.limit_reached(limit, value, agent),
                handle="",
                agent=agent,
                limit=limit,
            )
        parent.seq += 1
        child = Handle(
            id=f"{parent.id}/{agent}.{parent.seq}",
            agent=agent,
            prompt=prompt,
            parent=parent.id,
            depth=parent.depth + 1,
        )
        parent.children.append(child.id)
        self._handles[child.id] = child
        return child

    def _asker(self, h: Handle | None) -> Handle | None:
        """The handle whose own request keeps suspended `h` halted: `h`, or the child it
        awaits, and so on down. None when `h` is not suspended."""
        asker = None
        while h is not None and h.state == "suspended" and h.checkpoint is not None:
            asker = h
            awaiting = h.checkpoint.get("awaiting")
            h = self._handles.get(awaiting) if awaiting else None
        return asker

    def _reported(self, asker: Handle) -> Request:
        return _with_path(Request.from_dict(asker.checkpoint["pending"]), asker.id)

    def _result_of(self, h: Handle, *, messages: bool = True) -> AgentResult:
        usage, calls = self._spent(h)
        base = dict(
            handle=h.id,
            agent=h.agent or "",
            turns=h.turns,
            usage=usage,
            tool_calls=calls,
            messages=self.conversations.get(h.id) if messages else [],
        )
        asker = self._asker(h)
        if asker is not None:
            request = self._reported(asker)
            return AgentResult(status="pending", text=request.prompt, pending=request, **base)
        outcome = h.outcome or {"status": "closed", "text": "closed"}
        return AgentResult(
            status=outcome["status"],
            text=outcome.get("text") or "",
            limit=outcome.get("limit"),
            error=outcome.get("error"),
            **base,
        )

    # -- running a handle ----------------------------------------------------------------------

    def _client(self, h: Handle) -> Client:
        base = self.client
        agent = self.agents[h.agent]
        cap = self._max_turns(h)
        limited = self._limited(h)  # the chain does not change while the handle runs

        def budget_check(turns: int, usage: dict[str, int], tool_calls: int) -> str | None:
            h.live_usage, h.live_calls = usage, tool_calls
            if h.turns + turns >= cap:
                return "maxTurns"
            exhausted = self._exhausted(h, limited) if limited else None
            return exhausted[0] if exhausted else None

        return Client(
            backend=base.backend,
            model=agent.model or base.model,
            system_prompt=agent.system_prompt,
            max_turns=_NO_TURN_CAP,
            wait_for=self._escalator(h),
            hooks=base.hooks,
            timeout=base.timeout,
            budget_check=budget_check,
            # Every agent's reply as it is generated; `current_handle()` tells whose.
            on_text=base.on_text,
        )

    def _escalator(self, h: Handle) -> WaitFor | None:
        """The nearest interpreter up the chain (the runtime's last), as the loop's wait_for."""
        interpreter = next(
            (
                self.agents[a.agent].wait_for
                for a in self._chain(h)
                if a.agent is not None and self.agents[a.agent].wait_for is not None
            ),
            self.wait_for,
        )
        if interpreter is None:
            return None

        async def ask(request: Request) -> Answer | None:
            request.data = {**(request.data or {}), "path": h.id.split("/")}
            h.asking += 1  # calls of one turn may ask together: one suspended span
            if h.asking == 1:
                self._move(h, "suspended")
            try:
                return await _maybe_await(interpreter(request))
            finally:
                h.asking -= 1
                if h.asking == 0:
                    self._move(h, "running")

        return ask

    def _toolkit(self, h: Handle) -> Toolkit:
        agent = self.agents[h.agent]
        if agent.team:
            return Toolkit([*self._views[agent.name], self._task_tool(h, sorted(agent.team))])
        if agent.tools is None:  # all of them: the toolkit itself, as a single run uses it
            return self.toolkit
        view = self._kits.get(agent.name)  # the same view for every run: built once
        if view is None:
            view = self._kits[agent.name] = Toolkit(self._views[agent.name])
        return view

    async def _resume(
        self, h: Handle, pending: Request, answer: Answer, cancel: asyncio.Event | None
    ) -> AgentResult:
        messages = self.conversations.get(h.id) + list(h.checkpoint["messages"])
        h.checkpoint = None
        self._move(h, "idle")  # the answer is accepted; the checkpoint is restored
        return await self._run(h, cancel, (messages, pending, answer))

    async def _run(
        self,
        h: Handle,
        cancel: asyncio.Event | None,
        resume: tuple[list[dict[str, Any]], Request, Answer] | None = None,
        prompt: str | None = None,
    ) -> AgentResult:
        """Run one handle (fresh, resumed from its checkpoint, or continued with a follow-up
        `prompt` after its conversation); never raises for a failure of the run: it is
        recorded as the handle's outcome."""
        loop = asyncio.get_running_loop()
        h.inflight = loop.create_future()
        self._move(h, "running")
        outcome: dict[str, Any]
        result: RunResult | None = None
        current = _CURRENT_HANDLE.set(h.id)
        try:
            client, toolkit = self._client(h), self._toolkit(h)
            if resume is None:
                history = self.conversations.get(h.id)
                said = h.prompt if prompt is None else prompt
                result = await client.run(said, toolkit, history=history or None, cancel=cancel)
            else:
                result = await client.run_with_answer(toolkit, *resume, cancel=cancel)
        except RunCancelled as exc:
            outcome = {"status": "interrupted", "text": str(exc), "error": repr(exc)}
        except RunTimeout as exc:
            outcome = {"status": "timeout", "text": str(exc), "error": repr(exc)}
        except asyncio.CancelledError:  # its parent's run was stopped: so was this one
            add_usage(h.usage, h.live_usage)
            h.tool_calls += h.live_calls
            h.live_usage, h.live_calls = None, 0
            h.outcome = {"status": "interrupted", "text": "cancelled", "limit": None, "error": None}
            self._move(h, "idle")
            h.inflight.cancel()
            h.inflight = None
            raise
        except Exception as exc:  # a failing agent is its parent's error result, never a crash
            outcome = {
                "status": "error",
                "text": f"{type(exc).__name__}: {exc}",
                "error": repr(exc),
            }
        finally:
            _CURRENT_HANDLE.reset(current)
        if result is None:  # what the failed run spent still counts
            add_usage(h.usage, h.live_usage)
            h.tool_calls += h.live_calls
            h.outcome = {"limit": None, **outcome}
            self._move(h, "idle")
        else:
            self._record(h, result)
        h.live_usage, h.live_calls = None, 0
        settled = self._result_of(h, messages=False)  # the host reads `result()`
        h.inflight.set_result(settled)
        h.inflight = None
        return settled

    def _record(self, h: Handle, result: RunResult) -> None:
        h.turns += result.turns
        add_usage(h.usage, result.usage)
        messages = result.messages
        if result.status == "pending" and result.pending is not None:
            # the loop records one placeholder on a halt, the halted call's: not a call made
            h.tool_calls += len(result.tool_calls) - 1
            found = self.client.dialect.halted_turn(messages)  # handles share its backend
            index = found[0] if found is not None else len(messages)
            self.conversations.save(h.id, messages[:index])  # rewound: before the halted turn
            awaiting = None
            if result.pending.kind == SUBAGENT_KIND:
                awaiting = (result.pending.data or {}).get("handle")
            h.checkpoint = {
                "messages": messages[index:],
                "pending": result.pending.to_dict(),
                "awaiting": awaiting,
            }
            h.outcome = None
            self._move(h, "suspended")
            return
        h.tool_calls += len(result.tool_calls)
        self.conversations.save(h.id, messages)
        h.outcome = {"status": result.status, "text": result.text, "limit": result.limit}
        h.outcome["error"] = None
        self._move(h, "idle")

    # -- the task tool -------------------------------------------------------------------------

    def _task_tool(self, parent: Handle, team: list[str]) -> Tool:
        described = [(name, self.agents[name].description) for name in team]

        async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            agent, prompt = args.get("agent"), args.get("prompt")
            if agent not in team:
                return ToolResult(texts.not_in_team(agent, team), is_error=True)
            if not isinstance(prompt, str) or not prompt.strip():
                return ToolResult(texts.task_needs_prompt(agent), is_error=True)
            child = next(
                (
                    self._handles[cid]
                    for cid in parent.children
                    if self._handles[cid].agent == agent and self._handles[cid].prompt == prompt
                ),
                None,
            )
            if child is None:
                spawned = self._spawn(parent, agent, prompt)
                if isinstance(spawned, AgentResult):
                    return self._task_result(spawned, None)
                child = spawned
                outcome = await self._run(child, ctx.cancel if ctx else None)
            elif child.inflight is not None:  # the same task, asked twice in one turn
                outcome = await asyncio.shield(child.inflight)
            else:  # re-attached: its recorded result, or its request while suspended
                outcome = self._result_of(child, messages=False)
            return self._task_result(outcome, child)

        return Tool(
            name="task",
            description=texts.task_description(described),
            input_schema={
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "enum": team},
                    "prompt": {"type": "string"},
                },
                "required": ["agent", "prompt"],
            },
            source="native",
            execute=execute,
        )

    def _task_result(self, outcome: AgentResult, child: Handle | None) -> ToolResult:
        meta = {
            "agent": outcome.agent,
            "handle": outcome.handle,
            "status": outcome.status,
            "turns": outcome.turns,
            "totalTokens": outcome.usage.get("total_tokens", 0),
        }
        if outcome.status == "pending" and outcome.pending is not None:
            asked = outcome.pending
            waiting = Request(
                id=asked.id,
                kind=SUBAGENT_KIND,
                prompt=asked.prompt,
                data={"handle": outcome.handle, "path": (asked.data or {}).get("path")},
            )
            return ToolResult(asked.prompt, is_error=True, metadata={"pending": waiting})
        if child is None:  # a spawn a budget refused: its text already names the limit
            return ToolResult(outcome.text, is_error=True, metadata=meta)
        if child.state != "closed":
            self._move(child, "closed")  # its work is done; its result stays recorded
        if outcome.status == "done":
            return ToolResult(outcome.text, metadata=meta)
        text = texts.agent_stopped(outcome.agent, outcome.status, outcome.limit, outcome.text)
        return ToolResult(text, is_error=True, metadata=meta)
