"""MCP server declarations and the elicitation bridge: the parts that need no connection.

`toolnexus.mcp` is the public face of these (with `answer_elicitation`); this module sits
below both it and `toolnexus.mcp_client`, so the connection code and the facade never import
each other. The official `mcp` SDK is an optional extra (`toolnexus-web[mcp]`): this module
imports without it, and anything that needs it raises an `ImportError` naming the extra.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .schema import schema_errors
from .texts import DEFAULT_REASON
from .types import Answer, Request, new_request_id

__all__ = [
    "DECLINE_REASON",
    "ELICITATION_KIND",
    "MCP_EXTRA_HINT",
    "McpServer",
    "McpServerError",
    "answer_to_elicit_result",
    "elicit_action",
    "elicitation_errors",
    "elicitation_to_request",
    "require_mcp",
    "resolve_command",
    "servers_of",
]

ELICITATION_KIND = "elicitation"
"""The `Request.kind` of an MCP tool call halted on its server's elicitation."""

MCP_EXTRA_HINT = (
    "MCP support needs the `mcp` package, the optional extra of this project: "
    "pip install 'toolnexus-web[mcp]'"
)

_NAME_OK = re.compile(r"[^a-zA-Z0-9_-]")


def safe_name(text: str) -> str:
    """`text` with every character a provider refuses in a tool name (outside
    `[a-zA-Z0-9_-]`) replaced by `_`."""
    return _NAME_OK.sub("_", text)


_TRANSPORTS = ("stdio", "streamable-http", "sse", "auto")
_PROTOCOLS = ("legacy", "auto")


def require_mcp() -> Any:
    """Import the MCP SDK's `mcp.types`, or raise an `ImportError` naming the extra."""
    try:
        return importlib.import_module("mcp.types")
    except ImportError as exc:
        raise ImportError(MCP_EXTRA_HINT) from exc


class McpServerError(RuntimeError):
    """An MCP server could not be started or reached (`server` names it)."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(message)
        self.server = server


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    items = tuple(value)
    if not all(isinstance(v, str) for v in items):
        raise ValueError(f"{what} must be strings")
    return items


@dataclass(frozen=True, slots=True)
class McpServer:
    """One MCP server whose tools a toolkit offers the model.

    Exactly one of `command` (a stdio server run as a subprocess, with `args`, `env` added
    to a minimal inherited environment, and `cwd`) or `url` (an HTTP server, sent
    `headers`) is given. `transport` is derived when left out: `"stdio"` for a command,
    `"auto"` for a URL (streamable HTTP, then the older SSE transport when the server
    refuses it); `"streamable-http"` or `"sse"` pins one.

    `relay` and `approval` are tool names or glob patterns (`"delete_*"`), matched against
    the server's own tool name and the name the model sees: a relay tool is declared to the
    model and executed by the host (`kind:"tool_call"`); an approval tool runs only once a
    reviewer approved it (`kind:"approval"`). `prefix=True` always exposes the tools as
    `<name>__<tool>` (otherwise only on a name collision).

    `start_timeout` bounds starting and listing (seconds); `call_timeout` bounds one call
    (None: no bound; time spent waiting for an inline `wait_for` answer does not count).
    `protocol`: `"legacy"` (the 2025 handshake, where a server asks mid-call with
    `elicitation/create`) or `"auto"` (the SDK's negotiation: a 2026-07-28 server asks
    through `InputRequiredResult`; both are bridged the same way). `required=False` lets a
    toolkit start without this server when it fails to start (a warning is issued): its
    tools are not offered, and a call to one of them (a halted call resumed) is an error
    result naming the server and why.
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    transport: str | None = None
    relay: tuple[str, ...] = ()
    approval: tuple[str, ...] = ()
    prefix: bool = False
    start_timeout: float = 30.0
    call_timeout: float | None = 60.0
    protocol: str = "legacy"
    required: bool = True
    _label: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_OK.sub("", self.name):
            raise ValueError("McpServer.name must be a non-empty string of letters, digits, _ or -")
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of command or url")
        set_ = object.__setattr__
        set_(self, "args", _strings(self.args, f"MCP server {self.name!r}: args"))
        set_(self, "relay", _strings(self.relay, f"MCP server {self.name!r}: relay"))
        set_(self, "approval", _strings(self.approval, f"MCP server {self.name!r}: approval"))
        transport = self.transport or ("stdio" if self.command is not None else "auto")
        if transport not in _TRANSPORTS:
            raise ValueError(
                f"MCP server {self.name!r}: transport must be one of {', '.join(_TRANSPORTS)}"
            )
        if (transport == "stdio") != (self.command is not None):
            raise ValueError(
                f"MCP server {self.name!r}: transport {transport!r} does not fit "
                + ("a command" if self.command is not None else "a url")
            )
        set_(self, "transport", transport)
        if self.protocol not in _PROTOCOLS and not re.fullmatch(
            r"\d{4}-\d{2}-\d{2}", self.protocol
        ):
            raise ValueError(
                f"MCP server {self.name!r}: protocol must be 'legacy', 'auto' or a version date"
            )
        if self.start_timeout is None or self.start_timeout <= 0:
            raise ValueError(f"MCP server {self.name!r}: start_timeout must be positive")
        if self.call_timeout is not None and self.call_timeout <= 0:
            raise ValueError(f"MCP server {self.name!r}: call_timeout must be positive or None")
        set_(self, "_label", safe_name(self.name))

    @property
    def label(self) -> str:
        """The name as it prefixes tool names (`[a-zA-Z0-9_-]` only)."""
        return self._label

    @classmethod
    def stdio(cls, name: str, command: str, *args: str, **options: Any) -> McpServer:
        """`McpServer.stdio("time", "mcp-server-time", "--local-timezone", "UTC")`."""
        return cls(name=name, command=command, args=args, **options)

    @classmethod
    def http(cls, name: str, url: str, **options: Any) -> McpServer:
        """`McpServer.http("files", "https://host/mcp", headers={"Authorization": ...})`."""
        return cls(name=name, url=url, **options)

    @classmethod
    def from_dict(cls, name: str, config: Mapping[str, Any]) -> McpServer:
        """One entry of the common `{"mcpServers": {name: {...}}}` configuration.

        Keys: `command`, `args`, `env`, `cwd`, `url`, `headers`, `transport` (or `type`:
        `"stdio"`, `"http"`, `"streamable-http"`, `"sse"`), and this class's options
        (`relay`, `approval`, `prefix`, `start_timeout`, `call_timeout`, `protocol`,
        `required`). An unknown key is an error, so a typo never drops a gate silently.
        """
        if not isinstance(config, Mapping):
            raise ValueError(f"MCP server {name!r}: its configuration must be an object")
        known = {f.name for f in fields(cls) if f.init} - {"name"}
        options: dict[str, Any] = {}
        for key, value in config.items():
            if key == "type":
                value = {"http": "streamable-http", "streamableHttp": "streamable-http"}.get(
                    value, value
                )
                key = "transport"
            if key not in known:
                raise ValueError(f"MCP server {name!r}: unknown configuration key {key!r}")
            options[key] = value
        return cls(name=name, **options)


def resolve_command(command: str) -> str:
    """Where a stdio server's `command` runs from: a bare name (no directory part) installed
    beside the running interpreter (its environment's scripts directory, a virtualenv's
    `bin`) is that file, found before `PATH` is searched, so a server installed into the
    app's environment (`pip install mcp-server-time`) starts whether or not that `bin` is on
    `PATH`. Any other command is left as it is (the subprocess searches `PATH`)."""
    if not command or os.sep in command or (os.altsep and os.altsep in command):
        return command
    for directory in _interpreter_dirs():
        found = shutil.which(command, path=directory)
        if found:
            return found
    return command


def _interpreter_dirs() -> list[str]:
    dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    return [d for i, d in enumerate(dirs) if d and d not in dirs[:i]]


def servers_of(config: Any) -> list[McpServer]:
    """`create_toolkit(mcp_servers=...)`: `McpServer`s, a mapping of name to an `McpServer`
    or a configuration dict, or `{"mcpServers": {...}}`."""
    if config is None:
        return []
    if isinstance(config, Mapping):
        if "mcpServers" in config:
            config = config["mcpServers"]
        servers = [
            spec if isinstance(spec, McpServer) else McpServer.from_dict(name, spec)
            for name, spec in config.items()
        ]
    elif isinstance(config, Iterable) and not isinstance(config, str | bytes):
        servers = list(config)
        for spec in servers:
            if not isinstance(spec, McpServer):
                raise TypeError(f"mcp_servers entries must be McpServer, got {type(spec).__name__}")
    else:
        raise TypeError("mcp_servers must be McpServers or a mapping of name to configuration")
    names = [s.label for s in servers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"MCP server name(s) used twice: {', '.join(twice)}")
    return servers


# -- the elicitation bridge --------------------------------------------------------------


def _field(params: Any, *names: str) -> Any:
    for name in names:
        if isinstance(params, Mapping):
            if name in params:
                return params[name]
        elif hasattr(params, name):
            return getattr(params, name)
    return None


def elicitation_schema(params: Any) -> dict[str, Any] | None:
    """The `requestedSchema` of a form-mode elicitation, as a plain dict (None in url mode)."""
    if _field(params, "mode") == "url":
        return None
    schema = _field(params, "requestedSchema", "requested_schema")
    if schema is not None and hasattr(schema, "model_dump"):  # the MCP SDK's pydantic models
        schema = schema.model_dump(by_alias=True, exclude_none=True)
    return dict(schema) if isinstance(schema, Mapping) else None


def elicitation_message(params: Any) -> str:
    message = _field(params, "message")
    return message if isinstance(message, str) else ""


def elicitation_url(params: Any) -> str | None:
    if _field(params, "mode") != "url":
        return None
    url = _field(params, "url")
    return url if isinstance(url, str) else None


def elicitation_to_request(params: Any) -> Request:
    """Form mode -> `kind:"input"` with `data.schema`; url mode -> `kind:"authorization"`.

    The generic bridge for a host that answers elicitations itself. An MCP tool call of a
    toolkit halts with `kind:"elicitation"` instead (see `create_toolkit(mcp_servers=...)`).
    """
    prompt = elicitation_message(params)
    if _field(params, "mode") == "url":
        return Request(
            id=new_request_id("elc"),
            kind="authorization",
            prompt=prompt,
            url=elicitation_url(params),
        )
    schema = elicitation_schema(params)
    data = {"schema": schema} if schema is not None else None
    return Request(id=new_request_id("elc"), kind="input", prompt=prompt, data=data)


DECLINE_REASON = DEFAULT_REASON
"""The one refusal an MCP server hears as `decline` (any other reason is `cancel`)."""


def elicit_action(answer: Answer) -> str:
    """What an MCP server hears for `answer`: `"accept"` (ok), `"decline"` (a refusal whose
    reason is `"declined"`) or `"cancel"` (any other refusal: cancelled, expired, free text).
    The one rule, so a host can record what the server will be told (no SDK needed)."""
    if answer.ok:
        return "accept"
    return "decline" if answer.reason == DECLINE_REASON else "cancel"


def answer_to_elicit_result(answer: Answer) -> Any:
    """The SDK's `ElicitResult` for `answer` (`elicit_action`): accept with the answer's data
    as content, decline, or cancel."""
    types = require_mcp()
    action = elicit_action(answer)
    if action == "accept":
        return types.ElicitResult(action="accept", content=dict(answer.data or {}))
    return types.ElicitResult(action=action)


_ELICIT_VALUE = "must be a string, number, boolean, null or a list of strings"


def elicitation_errors(request: Request, data: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with `data` as the content accepting `request` (an elicitation halt or a
    bridged `input` request): every violation of its `data.schema`, each naming the field
    (`$.age: expected number, got string`), and values MCP cannot carry. Empty when fine."""
    content = dict(data or {})
    problems: list[str] = []
    for key, value in content.items():
        if not (
            value is None
            or isinstance(value, str | int | float | bool)
            or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        ):
            problems.append(f"$.{key}: {_ELICIT_VALUE}")
    schema = (request.data or {}).get("schema")
    if isinstance(schema, Mapping):
        problems.extend(schema_errors(content, schema))
    return problems
