"""The run loop: model turns, tool execution, suspensions, durable halts and resumes.

`Client` drives a run against a model backend (`model_http.HTTPModel` for an endpoint,
`in_process.InProcessModel` for a Python function; both speak through a `Dialect`). One driver
(`Client._drive`) serves `run`, `stream`, `continue_run` and the `*_with_answer` twins; it
reports progress through an optional `emit` callback, so `run` pays nothing for streaming,
and builds no hook payloads when no hooks are set. Build clients with `create_client` /
`create_in_process_client` (`toolnexus.client`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import texts
from .dialects import Call, Dialect, ModelTurn
from .mcp_spec import ELICITATION_KIND
from .relay import RELAY_KIND, is_relay_request, relay_calls_of, relay_result_for
from .toolkit import Toolkit
from .types import (
    Answer,
    Request,
    ResumeError,
    RunCancelled,
    RunResult,
    RunTimeout,
    ToolContext,
    ToolResult,
    pending_of,
)

__all__ = ["HALT", "Client", "ModelBackend", "declined_text"]


class _Halt:
    """What `wait_for` returns to leave a suspension to halt the run as it would without one
    (a host that decides some calls inline, by its own rules, and leaves the rest to people)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HALT"


HALT: Any = _Halt()

WaitFor = Callable[[Request], "Answer | Awaitable[Answer | None] | None"]
# Asked before each model call with this run's turns, usage and tool-call count; a name
# (e.g. "maxTokens") stops the run as `incomplete` with that limit.
BudgetCheck = Callable[[int, dict[str, int], int], "str | None"]
Emit = Callable[[dict[str, Any]], None]
_END = object()


class ModelBackend(Protocol):
    """What the loop needs from a model: one turn at a time.

    `complete(body, emit)` returns the turn, retrying as its transport allows; with `emit`
    (a `stream` run) it emits `{"type": "text", "delta": ...}` events as the text arrives.
    `streams`: the body built for a `stream` run asks the provider for a stream.
    """

    dialect: Dialect
    streams: bool

    async def complete(self, body: dict[str, Any], emit: Emit | None) -> ModelTurn: ...

    async def aclose(self) -> None: ...


def declined_text(request: Request, reason: str | None) -> str:
    """What the model reads when a non-relay suspension was refused (see `texts.declined`)."""
    return texts.declined(request.prompt, reason)


def _check_cancel(state: _RunState) -> None:
    # Checked between steps too: a fast in-process model may never yield to the race in
    # `_bounded`, and a set event must stop the run before its next model call.
    if state.cancel is not None and state.cancel.is_set():
        raise RunCancelled("run cancelled")


def _zero_usage() -> dict[str, int]:
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def _text_only(on_text: Callable[[str], None]) -> Emit:
    """An `emit` for the model backend that hands `on_text` the text deltas alone."""

    def emit(event: dict[str, Any]) -> None:
        if event.get("type") == "text" and event.get("delta"):
            on_text(event["delta"])

    return emit


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@dataclass(slots=True)
class _Slot:
    """One call of a turn while the turn settles."""

    call: Call
    result: ToolResult | None = None
    request: Request | None = None  # set while the call is suspended
    quiet: bool = False  # a result kept from the transcript: no event, no record


@dataclass(slots=True)
class _RunState:
    messages: list[dict[str, Any]]
    emit: Emit | None
    cancel: asyncio.Event | None
    turns: int = 0
    message_index: int = -1  # the transcript index of the assistant message being settled
    usage: dict[str, int] = field(default_factory=_zero_usage)
    records: list[dict[str, Any]] = field(default_factory=list)


class Client:
    """Runs prompts against a model with a toolkit. Create with `create_client` or
    `create_in_process_client`."""

    def __init__(
        self,
        *,
        backend: ModelBackend,
        model: str,
        system_prompt: str | None = None,
        max_turns: int = 10,
        wait_for: WaitFor | None = None,
        hooks: Any = None,
        timeout: float | None = None,
        budget_check: BudgetCheck | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.backend = backend
        self.model = model
        self.system_prompt = system_prompt or ""
        self.max_turns = max_turns
        self.wait_for = wait_for
        self.hooks = hooks
        self.timeout = timeout
        self.budget_check = budget_check
        # Called (synchronously, on the run's loop) with each piece of reply text as the
        # model generates it, in `run`, `continue_run` and `run_with_answer` too: a host
        # shows the reply live without consuming `stream`'s events. The stored transcript
        # still gets the whole turn.
        self.on_text = on_text

    @property
    def dialect(self) -> Dialect:
        return self.backend.dialect

    # -- public API --------------------------------------------------------------------------

    async def run(
        self,
        prompt: str,
        toolkit: Toolkit,
        *,
        history: list[dict[str, Any]] | None = None,
        cancel: asyncio.Event | None = None,
    ) -> RunResult:
        messages = self.dialect.start_messages(self.system_prompt, list(history or []), prompt)
        work = self._drive(toolkit, _RunState(messages, None, cancel))
        if cancel is None and self.timeout is None:
            return await work
        return await self._bounded(work, cancel)

    async def run_with_answer(
        self,
        toolkit: Toolkit,
        messages: list[dict[str, Any]],
        pending: Request,
        answer: Answer,
        *,
        cancel: asyncio.Event | None = None,
    ) -> RunResult:
        state = self._resume_state(messages, pending, answer, None, cancel)
        return await self._bounded(self._drive(toolkit, state, resume=(pending, answer)), cancel)

    async def continue_run(
        self,
        toolkit: Toolkit,
        messages: list[dict[str, Any]],
        *,
        cancel: asyncio.Event | None = None,
    ) -> RunResult:
        """Carry on from a stored transcript that stopped between steps (a host's worker died).

        An assistant turn whose calls lack results is completed first (recorded results are
        kept, the rest execute); a transcript that already ends with a final reply is done.
        Not for halted runs: those resume with `run_with_answer`.
        """
        if not messages:
            raise ResumeError("no transcript supplied: cannot continue an empty run")
        state = _RunState(list(messages), None, cancel)
        return await self._bounded(self._drive(toolkit, state, continuing=True), cancel)

    def stream(
        self,
        prompt: str,
        toolkit: Toolkit,
        *,
        history: list[dict[str, Any]] | None = None,
        cancel: asyncio.Event | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        messages = self.dialect.start_messages(self.system_prompt, list(history or []), prompt)
        return self._events(
            lambda emit: self._drive(toolkit, _RunState(messages, emit, cancel)), cancel
        )

    def stream_with_answer(
        self,
        toolkit: Toolkit,
        messages: list[dict[str, Any]],
        pending: Request,
        answer: Answer,
        *,
        cancel: asyncio.Event | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        def start(emit: Emit) -> Awaitable[RunResult]:
            state = self._resume_state(messages, pending, answer, emit, cancel)
            return self._drive(toolkit, state, resume=(pending, answer))

        return self._events(start, cancel)

    def run_sync(self, prompt: str, toolkit: Toolkit, **kwargs: Any) -> RunResult:
        return asyncio.run(self._sync(self.run(prompt, toolkit, **kwargs)))

    def run_with_answer_sync(
        self,
        toolkit: Toolkit,
        messages: list[dict[str, Any]],
        pending: Request,
        answer: Answer,
        **kwargs: Any,
    ) -> RunResult:
        return asyncio.run(
            self._sync(self.run_with_answer(toolkit, messages, pending, answer, **kwargs))
        )

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- deadline, cancellation, event plumbing ----------------------------------------------

    async def _bounded(self, work: Awaitable[RunResult], cancel: asyncio.Event | None) -> RunResult:
        if cancel is None and self.timeout is None:
            return await work
        task = asyncio.ensure_future(work)
        waiters: set[asyncio.Future[Any]] = {task}
        cancel_wait = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
        if cancel_wait is not None:
            waiters.add(cancel_wait)
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if cancel_wait is not None:
                cancel_wait.cancel()
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if cancel is not None and cancel.is_set():
            raise RunCancelled("run cancelled")
        raise RunTimeout(f"run exceeded its {self.timeout}s deadline")

    async def _events(
        self, start: Callable[[Emit], Awaitable[RunResult]], cancel: asyncio.Event | None
    ) -> AsyncIterator[dict[str, Any]]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.ensure_future(self._bounded(start(queue.put_nowait), cancel))
        task.add_done_callback(lambda _: queue.put_nowait(_END))
        try:
            while True:
                event = await queue.get()
                if event is _END:
                    break
                yield event
            task.result()  # re-raise the run's failure after the events it emitted
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _sync(self, work: Awaitable[RunResult]) -> RunResult:
        try:
            return await work
        finally:
            await self.aclose()  # the pooled client belongs to this short-lived event loop

    # -- hooks -------------------------------------------------------------------------------

    async def _hook(self, name: str, info: dict[str, Any]) -> Any:
        """Call hook `name` if set. Callers check `self.hooks is not None` first, so a run
        without hooks builds no payloads."""
        hooks = self.hooks
        fn = hooks.get(name) if isinstance(hooks, Mapping) else getattr(hooks, name, None)
        if fn is None:
            return None
        return await _maybe_await(fn(info))

    # -- the driver --------------------------------------------------------------------------

    def _resume_state(
        self,
        messages: list[dict[str, Any]],
        pending: Request,
        answer: Answer,
        emit: Emit | None,
        cancel: asyncio.Event | None,
    ) -> _RunState:
        if answer.id != pending.id:
            raise ResumeError(
                f"answer id {answer.id!r} does not echo the pending request id {pending.id!r}"
            )
        if not messages:
            raise ResumeError("no transcript supplied: cannot resume an empty run")
        return _RunState(list(messages), emit, cancel)

    async def _drive(
        self,
        toolkit: Toolkit,
        state: _RunState,
        resume: tuple[Request, Answer] | None = None,
        *,
        continuing: bool = False,
    ) -> RunResult:
        _check_cancel(state)
        dialect = self.dialect
        if resume is not None:
            halted = await self._resume_turn(toolkit, state, *resume)
            if halted is not None:
                return self._finish(state, "pending", halted.prompt, pending=halted)
        elif continuing:
            last = state.messages[-1] if state.messages else None
            if dialect.is_final_reply(last):
                return self._finish(state, "done", dialect.text_of(last))
            if dialect.open_turn(state.messages) is not None:
                halted = await self._resume_turn(toolkit, state, None, None)
                if halted is not None:
                    return self._finish(state, "pending", halted.prompt, pending=halted)
        backend = self.backend
        emit = state.emit
        if emit is None and self.on_text is not None:
            emit = _text_only(self.on_text)
        model_emit = emit if emit is not None and backend.streams else None
        tools = dialect.tools_of(toolkit)
        text = ""
        while state.turns < self.max_turns:
            _check_cancel(state)
            if self.budget_check is not None:
                limit = self.budget_check(state.turns, state.usage, len(state.records))
                if limit:
                    return self._finish(state, "incomplete", text, limit=limit)
            messages, turn_tools = state.messages, tools
            if self.hooks is not None:
                override = await self._hook(
                    "before_llm",
                    {
                        "messages": messages,
                        "tools": tools,
                        "model": self.model,
                        "turn": state.turns,
                    },
                )
                if isinstance(override, Mapping):
                    messages = override.get("messages", messages)
                    turn_tools = override.get("tools", turn_tools)
            body = dialect.body(
                self.model, self.system_prompt, messages, turn_tools, model_emit is not None
            )
            turn = await backend.complete(body, emit)
            usage = state.usage
            for key, value in turn.usage.items():
                usage[key] += value
            state.messages.append(turn.message)
            state.message_index = len(state.messages) - 1
            if self.hooks is not None:
                await self._hook(
                    "after_llm",
                    {
                        "response": turn.raw,
                        "model": self.model,
                        "turn": state.turns,
                        "messages": state.messages,
                    },
                )
            state.turns += 1
            text = turn.text
            if not turn.calls:
                return self._finish(state, "done", text)
            halted = await self._settle_turn(toolkit, state, [_Slot(c) for c in turn.calls])
            if halted is not None:
                return self._finish(state, "pending", halted.prompt, pending=halted)
        return self._finish(state, "incomplete", text, limit="maxTurns")

    def _finish(
        self,
        state: _RunState,
        status: str,
        text: str,
        *,
        pending: Request | None = None,
        limit: str | None = None,
    ) -> RunResult:
        result = RunResult(
            status=status,
            text=text,
            messages=state.messages,
            pending=pending,
            tool_calls=state.records,
            turns=state.turns,
            usage=state.usage,
            model=self.model,
            limit=limit,
        )
        if state.emit is not None:
            state.emit({"type": "usage", "usage": dict(state.usage)})
            state.emit({"type": "done", "result": result})
        return result

    async def _resume_turn(
        self, toolkit: Toolkit, state: _RunState, pending: Request | None, answer: Answer | None
    ) -> Request | None:
        """Rebuild the halted turn with the answer applied; returns a new request if it halts again.

        Without a pending request and answer, it completes an interrupted turn: calls whose
        results are in the transcript keep them, the others run now.
        """
        found = self.dialect.halted_turn(state.messages)
        if found is None:
            raise ResumeError("no halted assistant turn in the transcript: nothing to resume")
        index, calls = found
        state.message_index = index
        recorded = self.dialect.recorded_results(state.messages, index)
        slots = {c.id: _Slot(c) for c in calls}
        retry: dict[str, Answer] = {}
        halted_ids: set[str] = set()
        if pending is None or answer is None:
            pass
        elif is_relay_request(pending):
            relay_ids = [rc.id for rc in relay_calls_of(pending) if rc.id in slots]
            for position, cid in enumerate(relay_ids):
                name = slots[cid].call.name
                if not answer.ok:
                    slots[cid].result = ToolResult(
                        texts.relay_declined(name, answer.reason), is_error=True
                    )
                else:
                    slots[cid].result = relay_result_for(
                        answer, cid, first=position == 0
                    ) or ToolResult(texts.no_result_on_resume(name), is_error=True)
            halted_ids = set(relay_ids)
        else:
            cid = (pending.data or {}).get("callId")
            if cid not in slots:
                raise ResumeError(
                    f"pending request {pending.id!r} names no call of the halted turn (data.callId={cid!r})"
                )
            if answer.ok or pending.kind == ELICITATION_KIND:
                # An elicitation's tool runs again even when refused: its server hears the
                # decline or cancel, and the model reads the tool's result.
                retry[cid] = answer
            else:
                slots[cid].result = ToolResult(
                    texts.declined(pending.prompt, answer.reason), is_error=True
                )
            halted_ids = {cid}
        for cid, result in recorded.items():
            if cid in slots and cid not in halted_ids:
                slots[cid].result, slots[cid].quiet = result, True
        del state.messages[index + 1 :]
        return await self._settle_turn(toolkit, state, [slots[c.id] for c in calls], retry=retry)

    async def _settle_turn(
        self,
        toolkit: Toolkit,
        state: _RunState,
        slots: list[_Slot],
        *,
        retry: Mapping[str, Answer] | None = None,
    ) -> Request | None:
        """Execute what the turn still needs, resolve or halt on suspensions, record results.

        Used for a fresh turn and for a resumed one alike: on resume some slots arrive with
        results fixed in advance (kept from the transcript or decided by the answer), and
        `retry` names the halted call to run again with its answer.
        """
        retry = retry or {}
        emit = state.emit
        turn = state.turns
        if emit is not None:
            for s in slots:
                if s.result is None:
                    emit(
                        {
                            "type": "tool_call",
                            "id": s.call.id,
                            "name": s.call.name,
                            "args": s.call.args,
                        }
                    )
        todo = [s for s in slots if s.result is None]
        if self.hooks is None and type(toolkit).execute is Toolkit.execute:
            # Plain tools finish as they start; only async ones are awaited (together).
            running = [
                w
                for s in todo
                if (w := self._start(toolkit, s, retry.get(s.call.id), state)) is not None
            ]
        else:
            running = [self._execute(toolkit, s, retry.get(s.call.id), state) for s in todo]
        if len(running) == 1:
            await running[0]
        elif running:
            await asyncio.gather(*running)

        suspended = [s for s in slots if s.request is not None]
        halted: _Slot | None = None
        if suspended and self.wait_for is not None:
            await asyncio.gather(*(self._resolve(toolkit, s, state) for s in suspended))
            suspended = [s for s in slots if s.request is not None]  # left to halt (HALT)
        if suspended:
            halted = suspended[0]
            if halted.request.kind == RELAY_KIND:
                self._merge_relay_calls(halted.request, suspended[1:])
            if emit is not None:
                emit({"type": "pending", "request": halted.request})

        records: list[tuple[Call, ToolResult]] = []
        for s in slots:
            if s.request is not None:
                if s is not halted:
                    continue  # left out: it suspends again when the turn is resumed
                # The placeholder the halted call reads until the answer replaces it.
                s.result = ToolResult(s.request.prompt, is_error=True)
            records.append((s.call, s.result))
            if s.quiet:
                continue
            state.records.append(
                {
                    "id": s.call.id,
                    "name": s.call.name,
                    "args": s.call.args,
                    "output": s.result.output,
                    "is_error": s.result.is_error,
                }
            )
            if emit is not None and s is not halted:
                emit(
                    {
                        "type": "tool_result",
                        "id": s.call.id,
                        "name": s.call.name,
                        "output": s.result.output,
                        "is_error": s.result.is_error,
                    }
                )
        state.messages.extend(self.dialect.result_messages(records))
        if self.hooks is not None:
            await self._hook(
                "after_turn",
                {
                    "messages": state.messages,
                    "turn": turn,
                    "pending": halted.request if halted else None,
                },
            )
        return halted.request if halted else None

    @staticmethod
    def _merge_relay_calls(first: Request, others: list[_Slot]) -> None:
        calls = list((first.data or {}).get("calls") or [])
        for s in others:
            if s.request.kind == RELAY_KIND:
                calls.extend((s.request.data or {}).get("calls") or [])
        first.data = {**(first.data or {}), "calls": calls}

    async def _execute(
        self, toolkit: Toolkit, slot: _Slot, answer: Answer | None, state: _RunState
    ) -> None:
        """Run one call (through the tool hooks), leaving a result or a suspension on the slot."""
        call, turn = slot.call, state.turns
        args = call.args
        if call.error is not None:
            slot.result = ToolResult(texts.invalid_arguments(call.name, call.error), is_error=True)
            return
        hooks = self.hooks
        result: ToolResult | None = None
        if answer is None and hooks is not None:
            hooked = await self._hook(
                "before_tool", {"name": call.name, "args": args, "id": call.id, "turn": turn}
            )
            if isinstance(hooked, Mapping):
                if isinstance(hooked.get("result"), ToolResult):
                    result = hooked["result"]
                elif isinstance(hooked.get("args"), Mapping):
                    args = dict(hooked["args"])
        if result is None:
            ctx = ToolContext(
                answer=answer,
                call_id=call.id,
                arguments=call.raw,
                cancel=state.cancel,
                turn=turn,
                message_index=state.message_index,
            )
            result = await self._call_tool(toolkit, call.name, args, ctx)
        if self._land(slot, answer, result) and hooks is not None:
            slot.result = await self._after_tool(call, args, result, turn)

    def _start(
        self, toolkit: Toolkit, slot: _Slot, answer: Answer | None, state: _RunState
    ) -> Awaitable[None] | None:
        """`_execute` without hooks, for a `Toolkit`: a plain tool runs to its result here
        (None is returned); an async one returns the awaitable that lands its result."""
        call = slot.call
        if call.error is not None:
            slot.result = ToolResult(texts.invalid_arguments(call.name, call.error), is_error=True)
            return None
        ctx = ToolContext(
            answer=answer,
            call_id=call.id,
            arguments=call.raw,
            cancel=state.cancel,
            turn=state.turns,
            message_index=state.message_index,
        )
        try:
            started = toolkit.start(call.name, call.args, ctx)
        except (asyncio.CancelledError, RunCancelled, RunTimeout):
            raise
        except Exception as exc:  # a failing tool is the model's problem to read, not a crash
            started = ToolResult(texts.tool_failed(call.name, exc), is_error=True)
        if isinstance(started, ToolResult):
            self._land(slot, answer, started)
            return None
        return self._land_later(slot, answer, started)

    async def _land_later(
        self, slot: _Slot, answer: Answer | None, started: Awaitable[ToolResult]
    ) -> None:
        try:
            result = await started
        except (asyncio.CancelledError, RunCancelled, RunTimeout):
            raise
        except Exception as exc:
            result = ToolResult(texts.tool_failed(slot.call.name, exc), is_error=True)
        self._land(slot, answer, result)

    def _land(self, slot: _Slot, answer: Answer | None, result: ToolResult) -> bool:
        """Put a tool's result on its slot, or its suspension; True for a real result."""
        request = pending_of(result)
        if request is None:
            slot.result = result
            return True
        if answer is not None:  # suspended again after its answer: never loop
            slot.result = ToolResult(texts.unresolved(request.prompt), is_error=True)
        else:
            slot.request = self._stamp(request, slot.call)
        return False

    async def _call_tool(
        self, toolkit: Toolkit, name: str, args: dict[str, Any], ctx: ToolContext
    ) -> ToolResult:
        try:
            return await toolkit.execute(name, args, ctx)
        except (asyncio.CancelledError, RunCancelled, RunTimeout):
            raise
        except Exception as exc:  # a failing tool is the model's problem to read, not a crash
            return ToolResult(texts.tool_failed(name, exc), is_error=True)

    async def _after_tool(
        self, call: Call, args: dict[str, Any], result: ToolResult, turn: int
    ) -> ToolResult:
        replaced = await self._hook(
            "after_tool",
            {"name": call.name, "args": args, "result": result, "id": call.id, "turn": turn},
        )
        if isinstance(replaced, Mapping) and isinstance(replaced.get("result"), ToolResult):
            return replaced["result"]
        return result

    @staticmethod
    def _stamp(request: Request, call: Call) -> Request:
        """Bind a suspension to its provider call id, so resume never matches by text."""
        data = dict(request.data or {})
        if request.kind == RELAY_KIND and isinstance(data.get("calls"), list):
            stamped = []
            for entry in data["calls"]:
                entry = dict(entry) if isinstance(entry, Mapping) else {}
                if not entry.get("id"):
                    entry["id"] = call.id
                if (
                    call.raw is not None
                    and entry.get("name") == call.name
                    and entry.get("id") == call.id
                ):
                    entry["arguments"] = call.raw
                stamped.append(entry)
            data["calls"] = stamped
        else:
            data["callId"] = call.id
        request.data = data
        return request

    async def _resolve(self, toolkit: Toolkit, slot: _Slot, state: _RunState) -> None:
        """Ask `wait_for` about one suspension and settle the call with the answer."""
        request = slot.request
        if state.emit is not None:
            state.emit({"type": "pending", "request": request})
        answer = await _maybe_await(self.wait_for(request))
        if answer is HALT:
            return  # still suspended: the turn halts on it
        slot.request = None
        if answer is not None and answer.id != request.id:
            raise ResumeError(
                f"answer id {answer.id!r} does not echo the request id {request.id!r}"
            )
        if request.kind == ELICITATION_KIND:  # refused or not, its server must hear it
            await self._execute(
                toolkit, slot, answer or Answer(id=request.id, ok=False, reason="cancelled"), state
            )
            return
        if answer is None or not answer.ok:
            reason = answer.reason if answer is not None else None
            text = (
                texts.relay_declined(slot.call.name, reason)
                if request.kind == RELAY_KIND
                else texts.declined(request.prompt, reason)
            )
            slot.result = ToolResult(text, is_error=True)
            return
        await self._execute(toolkit, slot, answer, state)
