"""The toolkit: the set of tools a run may call, and how they are shown to providers."""

from __future__ import annotations

import asyncio
import inspect
import re
import warnings
from collections.abc import Awaitable, Iterable
from typing import Any

from .builtins import BUILTIN_NAMES, select_builtins
from .mcp_spec import require_mcp, servers_of
from .relay import RELAY_SOURCE
from .texts import tool_returned, unknown_tool
from .types import Tool, ToolContext, ToolResult

__all__ = ["Toolkit", "create_toolkit", "define_tool"]


def _check_relay_collisions(tools: Iterable[Tool]) -> None:
    clashes = sorted(
        {t.name for t in tools if t.source == RELAY_SOURCE and t.name in BUILTIN_NAMES}
    )
    if clashes:
        raise ValueError(
            f"relay tool name(s) {', '.join(clashes)} collides with a built-in tool; "
            "rename the relay tool"
        )


class Toolkit:
    def __init__(self, tools: Iterable[Tool] = (), *, mcp_connections: Iterable[Any] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._openai: list[dict[str, Any]] | None = None
        self._anthropic: list[dict[str, Any]] | None = None
        self._mcp = list(mcp_connections)  # `mcp_client.McpConnection`s this toolkit closes
        for tool in tools:
            self._add(tool)

    def _add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            warnings.warn(f"duplicate tool {tool.name!r} ignored (first one wins)", stacklevel=3)
            return
        self._tools[tool.name] = tool
        self._openai = self._anthropic = None

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def register(self, *tools: Tool) -> None:
        """Add tools after construction; a later tool replaces one of the same name."""
        _check_relay_collisions(tools)
        for tool in tools:
            self._tools.pop(tool.name, None)
            self._add(tool)

    async def execute(
        self, name: str, args: dict[str, Any] | None, ctx: ToolContext | None = None
    ) -> ToolResult:
        result = self.start(name, args, ctx)
        return result if isinstance(result, ToolResult) else await result

    def start(
        self, name: str, args: dict[str, Any] | None, ctx: ToolContext | None = None
    ) -> ToolResult | Awaitable[ToolResult]:
        """Begin executing a tool: its result when `execute` is a plain function, else an
        awaitable of it. What `execute` awaits; the loop runs plain tools this way without
        a task each."""
        tool = self._tools.get(name)
        if tool is None or tool.execute is None:
            return ToolResult(self._unknown(name), is_error=True)
        result = tool.execute(args if args is not None else {}, ctx or ToolContext())
        if isinstance(result, ToolResult):
            return result
        if inspect.isawaitable(result):
            return _settle(name, result)
        return _checked(name, result)

    def _unknown(self, name: str) -> str:
        """`Unknown tool: x`; when MCP servers failed to start, `x` may be one of their tools
        (a call made before, a resumed halt): the error names them and why."""
        if any(c.failed_to_start for c in self._mcp):
            from .mcp_client import unavailable_tool  # there are connections: the SDK is here

            return unavailable_tool(name, self._mcp) or unknown_tool(name)
        return unknown_tool(name)

    def skills_prompt(self) -> str:
        return ""

    def to_openai(self) -> list[dict[str, Any]]:
        if self._openai is None:
            self._openai = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.input_schema,
                    },
                }
                for t in self._tools.values()
            ]
        return self._openai

    def to_anthropic(self) -> list[dict[str, Any]]:
        if self._anthropic is None:
            self._anthropic = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in self._tools.values()
            ]
        return self._anthropic

    def mcp_status(self) -> dict[str, dict[str, Any]]:
        """Each MCP server by name: `transport`, `running`, its listed `tools` (the server's
        own names) and the `error` that stopped it, if any."""
        return {c.spec.name: c.status() for c in self._mcp}

    async def aclose(self) -> None:
        """Close the MCP servers' connections (stdio servers are stopped). Idempotent."""
        connections, self._mcp = self._mcp, []
        if connections:
            await asyncio.gather(*(c.aclose() for c in connections), return_exceptions=True)

    async def __aenter__(self) -> Toolkit:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _checked(name: str, result: Any) -> ToolResult:
    if isinstance(result, ToolResult):
        return result
    if isinstance(result, str):  # a convenience for plain functions returning text
        return ToolResult(result)
    return ToolResult(tool_returned(name, result), is_error=True)


async def _settle(name: str, pending: Awaitable[Any]) -> ToolResult:
    return _checked(name, await pending)


async def create_toolkit(
    *,
    builtins: Any = True,
    extra_tools: Iterable[Tool] = (),
    disable_tools: Iterable[str] = (),
    mcp_servers: Any = None,
    wait_for: Any = None,
) -> Toolkit:
    """Build a toolkit from MCP servers' tools, the builtins (see `builtins` toggles) and the
    host's own tools.

    A host tool may shadow a builtin of the same name, except a relay tool: a relayed `bash`
    would let the model believe it runs a local shell, so that is refused outright.

    `mcp_servers`: `toolnexus.mcp.McpServer`s (or a mapping of name to one, or to its
    configuration dict, or `{"mcpServers": {...}}`). They are started and listed now; a
    required server that fails raises `McpServerError`. An MCP tool never takes a builtin's
    or a host tool's name, nor another server tool's: on such a collision it is exposed as
    `<server>__<tool>`. `wait_for(request)` answers MCP elicitations inline, during the call
    (otherwise a call halts the run with a `kind:"elicitation"` request). The toolkit then
    holds connections: close it (`async with` / `aclose()`) in the event loop it was made in.
    """
    extras = list(extra_tools)
    _check_relay_collisions(extras)
    extra_names = {t.name for t in extras}
    tools = [t for t in select_builtins(builtins) if t.name not in extra_names] + extras
    connections: list[Any] = []
    specs = servers_of(mcp_servers)
    if specs:
        require_mcp()
        from .mcp_client import open_servers  # needs the optional `mcp` SDK

        connections, mcp_tools = await open_servers(
            specs, wait_for=wait_for, reserved=set(BUILTIN_NAMES) | extra_names
        )
        tools = mcp_tools + tools
    disabled = set(disable_tools)
    return Toolkit((t for t in tools if t.name not in disabled), mcp_connections=connections)


_NAME_OK = re.compile(r"[^a-zA-Z0-9_-]")

_PY_TYPES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    list: {"type": "array"},
    dict: {"type": "object"},
}


def _annotation_schema(annotation: Any) -> dict[str, Any]:
    import typing

    if annotation in _PY_TYPES:
        return dict(_PY_TYPES[annotation])
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple):
        schema: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = _annotation_schema(args[0])
        return schema
    if origin is dict:
        return {"type": "object"}
    if args and type(None) in args:  # Optional[X] / X | None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _annotation_schema(rest[0])
    return {}


def define_tool(fn: Any = None, *, name: str | None = None, description: str | None = None):
    """Build a `Tool` from a typed function; its parameters become the input schema.

    The function receives keyword arguments and returns a string (or a `ToolResult`).
    """

    def build(func: Any) -> Tool:
        sig = inspect.signature(func)
        hints = inspect.get_annotations(func, eval_str=True)
        props: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in sig.parameters.items():
            if pname == "ctx":
                continue
            props[pname] = _annotation_schema(hints.get(pname, Any))
            if param.default is inspect.Parameter.empty:
                required.append(pname)
        schema: dict[str, Any] = {"type": "object", "properties": props}
        if required:
            schema["required"] = required
        wants_ctx = "ctx" in sig.parameters

        async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            kwargs = {k: v for k, v in (args or {}).items() if k in props}
            if wants_ctx:
                kwargs["ctx"] = ctx
            out = func(**kwargs)
            if inspect.isawaitable(out):
                out = await out
            return (
                out if isinstance(out, ToolResult) else ToolResult("" if out is None else str(out))
            )

        return Tool(
            name=_NAME_OK.sub("_", name or func.__name__),
            description=description or inspect.getdoc(func) or "",
            input_schema=schema,
            source="native",
            execute=execute,
        )

    return build(fn) if fn is not None else build
