"""The client loop: model turns, tool execution, suspensions, durable halts and resumes.

One driver (`Client._drive`) serves `run`, `stream` and their `*_with_answer` twins; it
reports progress through an optional `emit` callback, so `run` pays nothing for streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from .dialects import ANTHROPIC, OPENAI, Call, Dialect, ModelTurn
from .relay import RELAY_KIND, decline_text, is_relay_request, relay_calls_of, relay_result_for
from .toolkit import Toolkit
from .transport import default_transport
from .types import (
    Answer,
    ModelError,
    Request,
    ResumeError,
    RunCancelled,
    RunResult,
    RunTimeout,
    ToolContext,
    ToolResult,
    pending_of,
)

__all__ = [
    "Client",
    "InProcessRequest",
    "InProcessResponse",
    "InProcessToolCall",
    "create_client",
    "create_in_process_client",
]

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
WaitFor = Callable[[Request], "Answer | Awaitable[Answer | None] | None"]
Emit = Callable[[dict[str, Any]], None]
_COMPACT = (",", ":")
_END = object()


def declined_text(request: Request, reason: str | None) -> str:
    """What the model reads when a non-relay suspension was refused."""
    return f"declined/expired: {request.prompt} (reason: {reason or 'declined'})"


def _check_cancel(state: _RunState) -> None:
    # Checked between steps too: a fast in-process model may never yield to the race in
    # `_bounded`, and a set event must stop the run before its next model call.
    if state.cancel is not None and state.cancel.is_set():
        raise RunCancelled("run cancelled")


def _zero_usage() -> dict[str, int]:
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


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


# -- in-process model -----------------------------------------------------------------------


@dataclass(slots=True)
class InProcessToolCall:
    id: str | None
    name: str
    arguments: Any = None


@dataclass(slots=True)
class InProcessResponse:
    content: str | None = None
    tool_calls: list[Any] = field(default_factory=list)
    usage: dict[str, Any] | None = None


@dataclass(slots=True)
class InProcessRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    model: str
    body: dict[str, Any]


def _in_process_reply(response: Any) -> dict[str, Any]:
    """Turn what a `generate` function returned into an OpenAI chat-completion reply."""
    if isinstance(response, InProcessResponse):
        content, calls, usage = response.content, response.tool_calls, response.usage
    elif isinstance(response, Mapping):
        content = response.get("content")
        calls = response.get("tool_calls", response.get("toolCalls")) or []
        usage = response.get("usage")
    elif isinstance(response, str):
        content, calls, usage = response, [], None
    else:
        raise ModelError(f"generate returned {type(response).__name__}, not an InProcessResponse")
    tool_calls = []
    for i, call in enumerate(calls or []):
        if isinstance(call, InProcessToolCall):
            cid, name, arguments = call.id, call.name, call.arguments
        elif isinstance(call, Mapping):
            cid, name, arguments = call.get("id"), call.get("name"), call.get("arguments")
        else:
            raise ModelError(f"generate returned a tool call of type {type(call).__name__}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {}, separators=_COMPACT)
        tool_calls.append(
            {
                "id": cid or f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    reply: dict[str, Any] = {
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ]
    }
    if isinstance(usage, Mapping):
        prompt = usage.get("prompt_tokens", usage.get("promptTokens", 0)) or 0
        completion = usage.get("completion_tokens", usage.get("completionTokens", 0)) or 0
        total = usage.get("total_tokens", usage.get("totalTokens", 0)) or prompt + completion
        reply["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": total,
        }
    return reply


# -- the client -----------------------------------------------------------------------------


class Client:
    """Runs prompts against a model with a toolkit. Create with `create_client` or
    `create_in_process_client`."""

    def __init__(
        self,
        *,
        dialect: Dialect,
        model: str,
        url: str | None = None,
        headers: dict[str, str] | None = None,
        generate: Callable[[InProcessRequest], Any] | None = None,
        system_prompt: str | None = None,
        max_turns: int = 10,
        wait_for: WaitFor | None = None,
        hooks: Any = None,
        retries: int = 2,
        retry_base_ms: float = 500,
        timeout: float | None = None,
        http_client: httpx.AsyncClient | None = None,
        request_timeout: float | None = 120.0,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.dialect = dialect
        self.model = model
        self.system_prompt = system_prompt or ""
        self.max_turns = max_turns
        self.wait_for = wait_for
        self.hooks = hooks
        self.retries = max(0, retries)
        self.retry_base = retry_base_ms / 1000
        self.timeout = timeout
        self._url = url
        self._headers = {"content-type": "application/json", **(headers or {})}
        self._generate = generate
        self._request_timeout = request_timeout
        self._http = http_client
        self._owns_http = http_client is None
        self._http_loop: asyncio.AbstractEventLoop | None = None

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
        return await self._bounded(self._drive(toolkit, _RunState(messages, None, cancel)), cancel)

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
        if self._http is not None and self._owns_http:
            await self._http.aclose()
            self._http = None

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

    # -- model calls -------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or (self._owns_http and self._http_loop is not loop):
            # The lean transport unless a proxy is configured (None keeps httpx's default).
            self._http = httpx.AsyncClient(
                timeout=self._request_timeout, transport=default_transport()
            )
            self._http_loop = loop
        return self._http

    async def _complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], emit: Emit | None
    ) -> ModelTurn:
        """One model turn, retried on throttling, server errors and broken replies."""
        streaming = emit is not None and self._generate is None
        body = self.dialect.body(self.model, self.system_prompt, messages, tools, streaming)
        payload = None if self._generate is not None else self._encode(body)
        attempt = 0
        while True:
            try:
                if self._generate is not None:
                    return await self._generate_turn(body, emit)
                if streaming:
                    return await self._stream_turn(payload, emit)
                return await self._post_turn(payload)
            except ModelError as exc:
                if not exc.retryable or attempt >= self.retries:
                    raise
                delay = getattr(exc, "retry_after", None)
                if delay is None:
                    delay = self.retry_base * (2**attempt) * (0.5 + random.random() / 2)
                attempt += 1
                await asyncio.sleep(delay)

    def _encode(self, body: dict[str, Any]) -> bytes:
        return json.dumps(body, separators=_COMPACT, ensure_ascii=False).encode()

    async def _post_turn(self, payload: bytes) -> ModelTurn:
        try:
            response = await self._client().post(self._url, content=payload, headers=self._headers)
        except httpx.TransportError as exc:
            raise ModelError(
                f"model endpoint unreachable: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        if response.status_code >= 400:
            raise self._status_error(response.status_code, response.headers, response.text)
        try:
            data = json.loads(response.content)
        except ValueError as exc:
            raise ModelError(
                f"model reply is not valid JSON: {exc}", status=response.status_code, retryable=True
            ) from exc
        if not isinstance(data, dict):
            raise ModelError("model reply is not a JSON object", retryable=True)
        return self.dialect.parse(data)

    @staticmethod
    def _status_error(status: int, headers: Mapping[str, str], text: str) -> ModelError:
        error = ModelError(
            f"model endpoint answered HTTP {status}: {text[:500]}",
            status=status,
            retryable=status in RETRY_STATUSES,
        )
        retry_after = headers.get("retry-after", "").strip()
        if retry_after.isdigit():
            error.retry_after = min(int(retry_after), 2147483647)  # type: ignore[attr-defined]
        return error

    async def _stream_turn(self, payload: bytes, emit: Emit) -> ModelTurn:
        assembler = self.dialect.new_stream_state()
        try:
            async with self._client().stream(
                "POST", self._url, content=payload, headers=self._headers
            ) as response:
                if response.status_code >= 400:
                    text = (await response.aread()).decode(errors="replace")
                    raise self._status_error(response.status_code, response.headers, text)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    try:
                        chunk = json.loads(payload)
                    except ValueError as exc:
                        raise ModelError(
                            f"model stream sent invalid JSON: {exc}", retryable=True
                        ) from exc
                    if isinstance(chunk, dict):
                        piece = assembler.feed(chunk)
                        if piece:
                            emit({"type": "text", "delta": piece})
        except httpx.TransportError as exc:
            raise ModelError(
                f"model endpoint unreachable: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        return assembler.finish()

    async def _generate_turn(self, body: dict[str, Any], emit: Emit | None) -> ModelTurn:
        request = InProcessRequest(
            messages=body["messages"], tools=body.get("tools") or [], model=self.model, body=body
        )
        try:
            reply = await _maybe_await(self._generate(request))
        except (asyncio.CancelledError, ModelError):
            raise
        except Exception as exc:
            raise ModelError(
                f"generate failed: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        turn = self.dialect.parse(_in_process_reply(reply))
        if emit is not None and turn.text:
            emit({"type": "text", "delta": turn.text})
        return turn

    # -- hooks -------------------------------------------------------------------------------

    async def _hook(self, name: str, info: dict[str, Any]) -> Any:
        hooks = self.hooks
        if hooks is None:
            return None
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
        if resume is not None:
            halted = await self._resume_turn(toolkit, state, *resume)
            if halted is not None:
                return self._finish(state, "pending", halted.prompt, pending=halted)
        elif continuing:
            last = state.messages[-1] if state.messages else None
            if self.dialect.is_final_reply(last):
                return self._finish(state, "done", self.dialect.text_of(last))
            if self.dialect.open_turn(state.messages) is not None:
                halted = await self._resume_turn(toolkit, state, None, None)
                if halted is not None:
                    return self._finish(state, "pending", halted.prompt, pending=halted)
        tools = self.dialect.tools_of(toolkit)
        text = ""
        while state.turns < self.max_turns:
            _check_cancel(state)
            messages, turn_tools = state.messages, tools
            override = await self._hook(
                "before_llm",
                {"messages": messages, "tools": tools, "model": self.model, "turn": state.turns},
            )
            if isinstance(override, Mapping):
                messages = override.get("messages", messages)
                turn_tools = override.get("tools", turn_tools)
            turn = await self._complete(messages, turn_tools, state.emit)
            for key, value in turn.usage.items():
                state.usage[key] += value
            state.messages.append(turn.message)
            state.message_index = len(state.messages) - 1
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
                    slots[cid].result = ToolResult(decline_text(name, answer.reason), is_error=True)
                else:
                    slots[cid].result = relay_result_for(
                        answer, cid, first=position == 0
                    ) or ToolResult(f"no result supplied on resume for {name}", is_error=True)
            halted_ids = set(relay_ids)
        else:
            cid = (pending.data or {}).get("callId")
            if cid not in slots:
                raise ResumeError(
                    f"pending request {pending.id!r} names no call of the halted turn (data.callId={cid!r})"
                )
            if answer.ok:
                retry[cid] = answer
            else:
                slots[cid].result = ToolResult(declined_text(pending, answer.reason), is_error=True)
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
        if len(todo) == 1:
            await self._execute(toolkit, todo[0], retry.get(todo[0].call.id), state)
        elif todo:
            await asyncio.gather(
                *(self._execute(toolkit, s, retry.get(s.call.id), state) for s in todo)
            )

        suspended = [s for s in slots if s.request is not None]
        halted: _Slot | None = None
        if suspended and self.wait_for is not None:
            await asyncio.gather(*(self._resolve(toolkit, s, state) for s in suspended))
        elif suspended:
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
            slot.result = ToolResult(
                f"invalid arguments for {call.name}: {call.error}", is_error=True
            )
            return
        result: ToolResult | None = None
        if answer is None:
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
        request = pending_of(result)
        if request is not None:
            if answer is not None:  # suspended again after its answer: never loop
                slot.result = ToolResult(f"unresolved: {request.prompt}", is_error=True)
                return
            slot.request = self._stamp(request, call)
            return
        slot.result = await self._after_tool(call, args, result, turn)

    async def _call_tool(
        self, toolkit: Toolkit, name: str, args: dict[str, Any], ctx: ToolContext
    ) -> ToolResult:
        try:
            return await toolkit.execute(name, args, ctx)
        except (asyncio.CancelledError, RunCancelled, RunTimeout):
            raise
        except Exception as exc:  # a failing tool is the model's problem to read, not a crash
            return ToolResult(f"tool {name} failed: {type(exc).__name__}: {exc}", is_error=True)

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
        slot.request = None
        if answer is not None and answer.id != request.id:
            raise ResumeError(
                f"answer id {answer.id!r} does not echo the request id {request.id!r}"
            )
        if answer is None or not answer.ok:
            reason = answer.reason if answer is not None else None
            text = (
                decline_text(slot.call.name, reason)
                if request.kind == RELAY_KIND
                else declined_text(request, reason)
            )
            slot.result = ToolResult(text, is_error=True)
            return
        await self._execute(toolkit, slot, answer, state)


# -- factories ------------------------------------------------------------------------------


def _api_key(style: str, explicit: str | None) -> str | None:
    if explicit:
        return explicit
    preferred = "ANTHROPIC_API_KEY" if style == "anthropic" else "OPENAI_API_KEY"
    return os.environ.get(preferred) or None


def create_client(
    *,
    base_url: str,
    style: str = "openai",
    model: str,
    api_key: str | None = None,
    headers: dict[str, str] | None = None,
    **options: Any,
) -> Client:
    """A client for an OpenAI-compatible (`style="openai"`) or Anthropic endpoint."""
    base = base_url.rstrip("/")
    key = _api_key(style, api_key)
    extra = dict(headers or {})
    if style == "openai":
        dialect, url = OPENAI, f"{base}/chat/completions"
        if key:
            extra.setdefault("authorization", f"Bearer {key}")
    elif style == "anthropic":
        dialect = ANTHROPIC
        url = f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages"
        extra.setdefault("anthropic-version", "2023-06-01")
        if key:
            extra.setdefault("x-api-key", key)
    else:
        raise ValueError(f"style must be 'openai' or 'anthropic', got {style!r}")
    return Client(dialect=dialect, model=model, url=url, headers=extra, **options)


def create_in_process_client(
    *, generate: Callable[[InProcessRequest], Any], model: str = "in-process", **options: Any
) -> Client:
    """A client whose model is a Python function: no URL, no socket. Transcripts are
    OpenAI-shaped. Failures of `generate` are not retried unless `retries` is given."""
    if not callable(generate):
        raise TypeError("create_in_process_client needs a callable generate")
    for wire_only in ("base_url", "api_key", "style", "http_client", "headers"):
        if wire_only in options:
            raise TypeError(f"create_in_process_client does not take {wire_only!r}")
    options.setdefault("retries", 0)
    return Client(dialect=OPENAI, model=model, generate=generate, **options)
