"""Connections to MCP servers: their tools as toolkit tools, their elicitations as halts.

Imported by `create_toolkit` only when MCP servers are declared (it needs the `mcp` SDK).
Each server's connection lives in its own task (the SDK's transports are entered and left
by one task), so a toolkit may be closed from any task of its event loop.

Calls to one server run one at a time: an MCP server's `elicitation/create` does not say
which call it belongs to, and a durable halt must bind the question to its call.

An elicitation during a call, with no inline `wait_for` on the toolkit, halts the call with
a `kind:"elicitation"` request and cancels the server's call. Its id carries a fingerprint
of the call (server, tool, arguments) and of the question (mode, message, schema); the
answer echoes that id, so when the run resumes - in this process or another one - the tool
is called again and the same question, asked again, gets the stored answer. Nothing is
kept in memory between the halt and the resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import inspect
import json
import os
import re
import tempfile
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import mcp.types as mt
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from . import texts
from .approval import approval_required
from .mcp_spec import (
    ELICITATION_KIND,
    McpServer,
    McpServerError,
    answer_to_elicit_result,
    elicitation_errors,
    elicitation_message,
    elicitation_schema,
    elicitation_url,
    resolve_command,
    safe_name,
)
from .relay import relay_tool
from .types import (
    Answer,
    Request,
    Tool,
    ToolContext,
    ToolResult,
    new_request_id,
    pending,
    pending_of,
)

__all__ = ["McpConnection", "answer_halted", "open_servers", "unavailable_tool"]

WaitFor = Callable[[Request], "Answer | Awaitable[Answer | None] | None"]

_MAX_NAME = 64  # what OpenAI accepts for a function name
_ELICITATION_ID = re.compile(r"elc-([0-9a-f]{8})([0-9a-f]{12})-")
_CLOSE_TIMEOUT = 10.0  # the SDK's stdio shutdown is bounded by ~6 s (close stdin, TERM, KILL)
_STDERR_TAIL = 4000


def _digest(value: Any, size: int) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def call_key(server: str, tool: str, args: dict[str, Any]) -> str:
    """Which call a question was asked in: server, the server's tool name, arguments."""
    return _digest([server, tool, args], 8)


def question_key(params: Any) -> str:
    """Which question was asked: mode, message and schema (url mode: its message only, as a
    server may mint a new link each time it asks)."""
    url = elicitation_url(params)
    if url is not None:
        return _digest(["url", elicitation_message(params)], 12)
    return _digest(["form", elicitation_message(params), elicitation_schema(params)], 12)


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    leaf = _leaf(exc)
    if isinstance(leaf, MCPError):
        return f"{leaf.message} (code {leaf.code})"
    text = str(leaf)
    return f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__


def _connection_lost(exc: BaseException) -> bool:
    leaf = _leaf(exc)
    if isinstance(leaf, MCPError):
        return leaf.code == mt.CONNECTION_CLOSED
    return isinstance(
        leaf,
        httpx2.TransportError
        | anyio.ClosedResourceError
        | anyio.BrokenResourceError
        | anyio.EndOfStream
        | ConnectionError
        | EOFError,
    )


def _refused_transport(exc: BaseException) -> bool:
    """The HTTP server answered but refused this transport (worth trying the other one)."""
    leaf = _leaf(exc)
    if isinstance(leaf, MCPError):
        return leaf.code != mt.CONNECTION_CLOSED
    return isinstance(leaf, httpx2.HTTPStatusError)


def _content_text(result: Any) -> str:
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        elif kind == "resource":
            inner = block.resource
            text = getattr(inner, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {inner.uri}]")
        else:
            parts.append(
                json.dumps(block.model_dump(mode="json", by_alias=True, exclude_none=True))
            )
    if not parts and result.structured_content is not None:
        parts.append(
            json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
        )
    return "\n".join(parts)


# -- texts the model reads ----------------------------------------------------------------


def _stopped(server: str, tool: str, detail: str) -> str:
    return f'MCP server "{server}" stopped before answering the call to {tool}: {detail}'


def _unavailable(server: str, tool: str, detail: str) -> str:
    return f"{tool} was not run: {detail}"


def _servers_down(tool: str, servers: list[McpConnection]) -> str:
    names = ", ".join(f'"{s.spec.name}"' for s in servers)
    which = f"MCP server {names} is" if len(servers) == 1 else f"MCP servers {names} are"
    their = "its" if len(servers) == 1 else "their"
    errors = "; ".join(s.error or "failed to start" for s in servers)
    return f"{tool} was not run: {which} unavailable, so {their} tools are not offered ({errors})"


def _timed_out(server: str, tool: str, seconds: float) -> str:
    return (
        f'MCP tool {tool} (server "{server}") did not finish within {seconds:g}s; '
        "the call was cancelled"
    )


def _refused(server: str, tool: str, detail: str) -> str:
    return f'MCP server "{server}" refused the call to {tool}: {detail}'


def _failed(server: str, tool: str, detail: str) -> str:
    return f'MCP tool {tool} (server "{server}") failed: {detail}'


def _asked_again(server: str, tool: str, message: str) -> str:
    return (
        f'MCP server "{server}" asked another question when {tool} was resumed '
        f'("{message}"): only the question the reviewer answered can be replayed, so the call '
        "was cancelled. Call the tool again to put the new question to the reviewer."
    )


def _arguments_changed(server: str, tool: str) -> str:
    return (
        f"{tool} was not run: the answer was given for the question MCP server "
        f'"{server}" asked during a call with other arguments'
    )


def _answer_unfit(server: str, tool: str, problems: list[str]) -> str:
    return (
        f'The answer to the question of MCP server "{server}" does not fit its form '
        f"({'; '.join(problems)}); {tool} was cancelled"
    )


def _answer_failed(server: str, tool: str, detail: str) -> str:
    return (
        f'Answering the question of MCP server "{server}" failed ({detail}); {tool} was cancelled'
    )


class _Refused(Exception):
    """Starting over streamable HTTP failed because the server refused the transport."""

    def __init__(self, error: McpServerError) -> None:
        super().__init__(str(error))
        self.error = error


# -- one call in flight -------------------------------------------------------------------


@dataclass(slots=True)
class _Call:
    tool: str  # the server's name for the tool
    exposed: str  # the name the model called
    args: dict[str, Any]
    replay: Answer | None  # the answer to replay (a resumed elicitation halt)
    replay_key: str | None
    stopped: asyncio.Future[ToolResult]  # set when the call must end now (halt or error)
    released: asyncio.Future[Any]  # what a waiting elicitation callback finally answers
    deadline: float | None = None
    waiting: bool = False  # an inline wait_for is asking a human: the timeout is paused
    replayed: bool = False
    refusal: tuple[str, str] | None = None  # (prompt, reason) of a refused question

    def stop(self, result: ToolResult) -> None:
        if not self.stopped.done():
            self.stopped.set_result(result)


class McpConnection:
    """One declared server: its connection, its tools, and the calls made to it."""

    def __init__(self, spec: McpServer, wait_for: WaitFor | None = None) -> None:
        self.spec = spec
        self.wait_for = wait_for
        self.tools: list[Any] = []  # the SDK's `Tool`s, as listed at start
        self.error: str | None = None  # why it is not running, when it is not
        self.transport = spec.transport
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self._call: _Call | None = None
        self._closed = False
        self._started = False  # it started once (its tools were listed)
        # The server's stderr, for the last lines of a failure; closed by `aclose`.
        self._errlog = tempfile.TemporaryFile() if spec.command is not None else None  # noqa: SIM115

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._client is not None

    @property
    def failed_to_start(self) -> bool:
        """It never started, so its tools were never listed (an optional server left out)."""
        return not self._started and self.error is not None

    def status(self) -> dict[str, Any]:
        return {
            "transport": self.transport,
            "running": self.running,
            "tools": [t.name for t in self.tools],
            "error": self.error,
        }

    async def start(self) -> None:
        """Connect, shake hands and list the tools; raises `McpServerError`."""
        kinds = (
            ["streamable-http", "sse"] if self.spec.transport == "auto" else [self.spec.transport]
        )
        errors: list[McpServerError] = []
        for kind in kinds:
            try:
                await self._start(kind)
            except _Refused as exc:  # the HTTP server refused this transport: try the next
                errors.append(exc.error)
                continue
            except McpServerError as exc:
                errors.append(exc)
                break
            self.transport, self.error, self._started = kind, None, True
            return
        error = errors[0]
        if len(errors) > 1:
            error = McpServerError(self.spec.name, "; ".join(str(e) for e in errors))
        self.error = str(error)
        raise error

    async def _start(self, kind: str) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[tuple[Client, list[Any]]] = loop.create_future()
        stop = asyncio.Event()
        owner = asyncio.create_task(self._own(kind, ready, stop), name=f"mcp:{self.spec.name}")
        try:
            client, tools = await asyncio.wait_for(asyncio.shield(ready), self.spec.start_timeout)
        except BaseException as exc:
            ready.cancel()
            await _end(owner, stop, cancel=True)
            if isinstance(exc, asyncio.CancelledError):
                raise
            error = self._start_failed(kind, exc)
            if kind == "streamable-http" and _refused_transport(exc):
                raise _Refused(error) from None
            raise error from None
        self._owner, self._stop, self._client, self.tools = owner, stop, client, tools

    async def _own(
        self, kind: str, ready: asyncio.Future[tuple[Client, list[Any]]], stop: asyncio.Event
    ) -> None:
        """The task that holds the connection open until `stop` is set."""
        try:
            async with Client(
                self._transport(kind),
                mode=self.spec.protocol,
                elicitation_callback=self._on_elicit,
                cache=None,
            ) as client:
                tools = await _list_tools(client)
                if ready.done():
                    return
                ready.set_result((client, tools))
                await stop.wait()
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            if not ready.done():
                ready.cancel() if cancelled else ready.set_exception(exc)
            if cancelled:
                raise
            # After the start, a failing transport shows in the calls (connection closed).

    def _transport(self, kind: str) -> Any:
        spec = self.spec
        if kind == "stdio":
            assert spec.command is not None
            params = StdioServerParameters(
                command=resolve_command(spec.command),  # the app's own bin first
                args=list(spec.args),
                env=dict(spec.env) if spec.env else None,
                cwd=spec.cwd,
            )
            return stdio_client(params, errlog=self._errlog)  # type: ignore[arg-type]
        assert spec.url is not None
        headers = dict(spec.headers or {})
        if kind == "sse":
            return sse_client(spec.url, headers=headers)
        return _streamable(spec.url, headers)

    async def aclose(self) -> None:
        self._closed = True
        await self._disconnect()
        if self._errlog is not None:
            self._errlog.close()

    async def _disconnect(self) -> None:
        owner, stop = self._owner, self._stop
        self._owner = self._stop = self._client = None
        if owner is not None and stop is not None:
            await _end(owner, stop)

    def _where(self) -> str:
        spec = self.spec
        if spec.command is not None:
            return "command " + " ".join([spec.command, *spec.args])
        return f"{spec.url}"

    def _stderr_tail(self) -> str:
        errlog = self._errlog
        if errlog is None or errlog.closed or not hasattr(os, "pread"):
            return ""
        try:
            fd = errlog.fileno()
            size = os.fstat(fd).st_size
            data = os.pread(fd, _STDERR_TAIL, max(0, size - _STDERR_TAIL))
        except OSError:
            return ""
        lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
        tail = " | ".join([line for line in lines if line][-3:])
        return tail[-600:]

    def _with_stderr(self, text: str) -> str:
        tail = self._stderr_tail()
        return f"{text} (its stderr ends: {tail})" if tail else text

    def _start_failed(self, kind: str, exc: BaseException) -> McpServerError:
        leaf = _leaf(exc)
        if isinstance(exc, TimeoutError):
            why = f"no answer within {self.spec.start_timeout:g}s"
        elif isinstance(leaf, FileNotFoundError | PermissionError):
            why = f"cannot run {self.spec.command!r}: {leaf.strerror or leaf}"
        elif isinstance(leaf, MCPError) and leaf.code == mt.CONNECTION_CLOSED:
            why = "it closed the connection before it was ready"
        elif isinstance(leaf, httpx2.TransportError):
            why = f"cannot connect ({_describe(leaf)})"
        else:
            why = _describe(leaf)
        via = "" if kind == "stdio" else f" over {kind}"
        name = self.spec.name
        return McpServerError(
            name,
            self._with_stderr(f'MCP server "{name}" failed to start ({self._where()}{via}): {why}'),
        )

    # -- calls -------------------------------------------------------------------------------

    def tool(self, listed: Any, name: str) -> Tool:
        """The toolkit tool for one listed MCP tool, exposed as `name`."""
        spec = self.spec
        description = listed.description or listed.title or ""
        schema = dict(listed.input_schema or {}) or {"type": "object", "properties": {}}
        relay = _matches(spec.relay, listed.name, name)
        gated = _matches(spec.approval, listed.name, name)
        if relay and gated:
            raise ValueError(
                f'MCP tool {listed.name!r} of server "{spec.name}" matches both a relay and an '
                "approval pattern: choose one"
            )
        if relay:
            return relay_tool(name, description, schema)
        server_name = listed.name

        async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            answer = ctx.answer if ctx is not None else None
            return await self.call(server_name, name, dict(args or {}), answer)

        tool = Tool(
            name=name, description=description, input_schema=schema, source="mcp", execute=execute
        )
        return approval_required(tool) if gated else tool

    async def call(
        self, tool: str, exposed: str, args: dict[str, Any], answer: Answer | None = None
    ) -> ToolResult:
        """Call `tool`; `answer` is the host's answer to an elicitation this call halted on."""
        name = self.spec.name
        replay_key = None
        if answer is not None:
            found = _ELICITATION_ID.match(answer.id)
            if found is None:
                answer = None  # an answer meant for someone else (a gate's): not ours to replay
            elif found.group(1) != call_key(name, tool, args):
                return ToolResult(_arguments_changed(name, exposed), is_error=True)
            else:
                replay_key = found.group(2)
        async with self._lock:
            if self._closed:
                return ToolResult(
                    _unavailable(
                        name, exposed, f'the toolkit holding MCP server "{name}" is closed'
                    ),
                    is_error=True,
                )
            if self._client is None:
                try:
                    await self.start()  # it stopped earlier: one try to start it again
                except McpServerError as exc:
                    return ToolResult(_unavailable(name, exposed, str(exc)), is_error=True)
            loop = asyncio.get_running_loop()
            call = _Call(
                tool=tool,
                exposed=exposed,
                args=args,
                replay=answer,
                replay_key=replay_key,
                stopped=loop.create_future(),
                released=loop.create_future(),
            )
            self._call = call
            try:
                return await self._run(call)
            finally:
                self._call = None
                if not call.released.done():  # after the call was cancelled, never before
                    call.released.set_result(mt.ElicitResult(action="cancel"))

    async def _run(self, call: _Call) -> ToolResult:
        client = self._client
        assert client is not None
        loop = asyncio.get_running_loop()
        timeout = self.spec.call_timeout
        call.deadline = None if timeout is None else loop.time() + timeout
        task = asyncio.ensure_future(client.call_tool(call.tool, call.args))
        try:
            while True:
                remaining = (
                    timeout
                    if call.deadline is None or call.waiting
                    else call.deadline - loop.time()
                )
                if remaining is not None and remaining <= 0:
                    return ToolResult(
                        _timed_out(self.spec.name, call.exposed, timeout or 0), is_error=True
                    )
                await asyncio.wait(
                    {task, call.stopped}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                if call.stopped.done():
                    return call.stopped.result()
                if task.done():
                    return await self._outcome(call, task)
        finally:
            if not task.done():
                task.cancel()  # the SDK tells the server (notifications/cancelled)
                await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: never logged as unhandled

    async def _outcome(self, call: _Call, task: asyncio.Future[Any]) -> ToolResult:
        name = self.spec.name
        try:
            result = task.result()
        except Exception as exc:
            if _connection_lost(exc):
                detail = self._with_stderr(_describe(exc))
                self.error = _stopped(name, call.exposed, detail)
                await self._disconnect()
                return ToolResult(self.error, is_error=True)
            leaf = _leaf(exc)
            if isinstance(leaf, MCPError):
                return ToolResult(_refused(name, call.exposed, _describe(leaf)), is_error=True)
            return ToolResult(_failed(name, call.exposed, _describe(leaf)), is_error=True)
        output = _content_text(result)
        is_error = bool(result.is_error)
        if call.refusal is not None:  # the reviewer refused the server's question
            prompt, reason = call.refusal
            refused = texts.declined(prompt, reason)
            output, is_error = (f"{refused}\n{output}" if output else refused), True
        metadata = (
            {"structuredContent": result.structured_content}
            if result.structured_content is not None
            else None
        )
        return ToolResult(output, is_error=is_error, metadata=metadata)

    # -- elicitation -------------------------------------------------------------------------

    def _request(self, call: _Call, params: Any) -> Request:
        name = self.spec.name
        url = elicitation_url(params)
        data: dict[str, Any] = {
            "server": name,
            "tool": call.exposed,
            "mode": "url" if url is not None else "form",
            "input": dict(call.args),
        }
        if call.tool != call.exposed:
            data["serverTool"] = call.tool
        schema = elicitation_schema(params)
        if schema is not None:
            data["schema"] = schema
        key = call_key(name, call.tool, call.args) + question_key(params)
        return Request(
            id=new_request_id(f"elc-{key}"),
            kind=ELICITATION_KIND,
            prompt=elicitation_message(params),
            url=url,
            data=data,
        )

    async def _on_elicit(self, context: Any, params: Any) -> Any:
        call = self._call
        if call is None or call.stopped.done():
            return mt.ErrorData(
                code=mt.INVALID_REQUEST, message="no tool call is waiting for this question"
            )
        request = self._request(call, params)
        if self.wait_for is not None:
            return await self._ask_inline(call, request)
        if call.replay is not None:
            if not call.replayed and question_key(params) == call.replay_key:
                call.replayed = True
                return await self._respond(call, request, call.replay)
            call.stop(
                ToolResult(
                    _asked_again(self.spec.name, call.exposed, request.prompt), is_error=True
                )
            )
        else:  # halt: the run stops here durably; the server's call is cancelled
            call.stop(
                pending(
                    kind=request.kind,
                    prompt=request.prompt,
                    id=request.id,
                    url=request.url,
                    data=request.data,
                )
            )
        return await call.released

    async def _ask_inline(self, call: _Call, request: Request) -> Any:
        assert self.wait_for is not None
        loop = asyncio.get_running_loop()
        call.waiting = True
        try:
            answer = self.wait_for(request)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:
            call.stop(
                ToolResult(
                    _answer_failed(self.spec.name, call.exposed, _describe(exc)), is_error=True
                )
            )
            return await call.released
        finally:
            call.waiting = False
            if self.spec.call_timeout is not None:
                call.deadline = loop.time() + self.spec.call_timeout
        if answer is None:
            answer = Answer(id=request.id, ok=False, reason="cancelled")
        if answer.id != request.id:
            detail = f"answer id {answer.id!r} does not echo the request id {request.id!r}"
            call.stop(
                ToolResult(_answer_failed(self.spec.name, call.exposed, detail), is_error=True)
            )
            return await call.released
        return await self._respond(call, request, answer)

    async def _respond(self, call: _Call, request: Request, answer: Answer) -> Any:
        if not answer.ok:
            call.refusal = call.refusal or (request.prompt, answer.reason)
            return answer_to_elicit_result(answer)
        if request.url is not None:
            return mt.ElicitResult(action="accept")
        problems = elicitation_errors(request, answer.data)
        if problems:
            call.stop(
                ToolResult(_answer_unfit(self.spec.name, call.exposed, problems), is_error=True)
            )
            return await call.released
        return answer_to_elicit_result(answer)


@contextlib.asynccontextmanager
async def _streamable(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    timeout = httpx2.Timeout(30.0, read=300.0)  # the SDK's defaults; calls have their own
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


async def _list_tools(client: Client) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    for _ in range(1000):  # a paginator that never ends cannot hang the start
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


async def _end(owner: asyncio.Task[None], stop: asyncio.Event, *, cancel: bool = False) -> None:
    """Let the owner task leave the connection (the SDK stops the process), then reap it."""
    stop.set()
    if cancel:
        owner.cancel()
    done, _ = await asyncio.wait({owner}, timeout=_CLOSE_TIMEOUT)
    if not done:
        owner.cancel()
        await asyncio.wait({owner}, timeout=_CLOSE_TIMEOUT)
    if owner.done() and not owner.cancelled():
        owner.exception()  # retrieved: never logged as unhandled


def _matches(patterns: Iterable[str], *names: str) -> bool:
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)


def _exposed_names(
    servers: list[McpConnection], reserved: set[str]
) -> list[tuple[McpConnection, Any, str]]:
    """The namespacing rule: an MCP tool keeps its (sanitized) name unless that name is a
    builtin's, one of the host's tools', or another MCP tool's; then every MCP tool of that
    name becomes `<server>__<tool>`. `prefix=True` on a server always prefixes its tools."""
    entries = [
        (server, listed, safe_name(listed.name)[:_MAX_NAME] or "_")
        for server in servers
        for listed in server.tools
    ]
    counts = Counter(base for _, _, base in entries)
    out: list[tuple[McpConnection, Any, str]] = []
    taken: set[str] = set()
    for server, listed, base in entries:
        name = base
        if server.spec.prefix or counts[base] > 1 or base in reserved:
            name = f"{server.spec.label}__{base}"[:_MAX_NAME]
        if name in taken or name in reserved:
            raise ValueError(
                f"MCP tool name {name!r} is taken even after prefixing it with its server's "
                "name: rename the server or disable one of the tools"
            )
        taken.add(name)
        out.append((server, listed, name))
    return out


def _warn_unmatched(server: McpConnection) -> None:
    names = [t.name for t in server.tools]
    for what, patterns in (("relay", server.spec.relay), ("approval", server.spec.approval)):
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                warnings.warn(
                    f'MCP server "{server.spec.name}": {what} pattern {pattern!r} matches none of '
                    f"its tools ({', '.join(names) or 'none listed'})",
                    stacklevel=4,
                )


def unavailable_tool(name: str, servers: Iterable[McpConnection]) -> str | None:
    """The error for a call to `name`, a tool the toolkit does not offer, when MCP servers
    failed to start (their tools were never listed, so `name` may be one of theirs): names
    them and why. A `<server>__` prefix of `name` narrows it to that server. None when every
    server started."""
    down = [s for s in servers if s.failed_to_start]
    if not down:
        return None
    own = [s for s in down if name.startswith(f"{s.spec.label}__")]
    return _servers_down(name, own or down)


async def answer_halted(specs: list[McpServer], request: Request, answer: Answer) -> ToolResult:
    """Give the server whose question halted a call (`request`, kind "elicitation") the
    `answer`, outside any run: only that server is started, the call is replayed with the
    same arguments and, when the server asks the same question, the answer is given to it.
    A server that cannot start, or a call that fails, is an error result."""
    data = request.data or {}
    name, exposed, args = data.get("server"), data.get("tool"), data.get("input")
    if request.kind != ELICITATION_KIND or not (
        isinstance(name, str) and isinstance(exposed, str) and isinstance(args, dict)
    ):
        raise ValueError("not the request of an MCP server's question (kind elicitation)")
    if answer.id != request.id:
        raise ValueError(f"answer id {answer.id!r} does not echo the request id {request.id!r}")
    tool = data.get("serverTool") or exposed
    spec = next((s for s in specs if s.name == name), None)
    if spec is None:
        return ToolResult(
            _unavailable(name, exposed, f'MCP server "{name}" is not among the servers given'),
            is_error=True,
        )
    server = McpConnection(spec)
    try:
        try:
            await server.start()
        except McpServerError as exc:
            return ToolResult(_unavailable(name, exposed, str(exc)), is_error=True)
        result = await server.call(tool, exposed, dict(args), answer)
    finally:
        await server.aclose()
    asked = pending_of(result)
    if asked is not None:  # never with a replayed answer; a question is never left open
        return ToolResult(texts.unresolved(asked.prompt), is_error=True)
    return result


async def open_servers(
    specs: list[McpServer], *, wait_for: WaitFor | None, reserved: set[str]
) -> tuple[list[McpConnection], list[Tool]]:
    """Start every server (concurrently), list their tools and build the toolkit's tools.

    A required server that fails to start closes the others and raises `McpServerError`;
    an optional one is left out with a warning (its connection stays, with its error: a call
    to a tool the toolkit does not offer names it, see `unavailable_tool`).
    """
    servers = [McpConnection(spec, wait_for) for spec in specs]
    try:
        outcomes = await asyncio.gather(*(s.start() for s in servers), return_exceptions=True)
        failed = [
            (s, o) for s, o in zip(servers, outcomes, strict=True) if isinstance(o, BaseException)
        ]
        for _, outcome in failed:
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
        required = [o for s, o in failed if s.spec.required]
        if required:
            if len(required) == 1:
                raise required[0]
            raise McpServerError(
                ", ".join(str(getattr(o, "server", "?")) for o in required),
                "; ".join(str(o) for o in required),
            )
        for _, outcome in failed:
            warnings.warn(f"{outcome} (left out: the server is not required)", stacklevel=3)
        live = [s for s in servers if s.running]
        tools = [
            server.tool(listed, name) for server, listed, name in _exposed_names(live, reserved)
        ]
        for server in live:
            _warn_unmatched(server)
    except BaseException:
        await asyncio.gather(*(s.aclose() for s in servers), return_exceptions=True)
        raise
    return servers, tools
