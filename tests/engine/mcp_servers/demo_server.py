"""A small MCP server for the engine tests, written with the SDK's `MCPServer`.

Run: `python demo_server.py` (stdio), `python demo_server.py http` (streamable HTTP) or
`python demo_server.py sse`; over HTTP it binds 127.0.0.1 on a free port and prints the port
on its first stdout line. `DEMO_MCP_LOG` names a file that receives one JSON line per event
(start, call, what each elicitation answered), so a test can tell what the server saw.
`DEMO_MCP_TOKEN` makes the HTTP server refuse requests without `X-Demo-Token: <token>`.
"""

import asyncio
import json
import os
import socket
import sys
import uuid
from typing import Annotated, Any

from mcp.server.mcpserver import Context, Elicit, ElicitationResult, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

server = MCPServer("demo")


def log(event: str, **fields: Any) -> None:
    path = os.environ.get("DEMO_MCP_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


class Name(BaseModel):
    name: str


class Age(BaseModel):
    age: int


class Colour(BaseModel):
    colour: str


class Confirm(BaseModel):
    confirm: bool


def outcome(tool: str, result: Any) -> dict[str, Any]:
    data = getattr(result, "data", None)
    fields = {"tool": tool, "action": result.action}
    if data is not None:
        fields["content"] = data.model_dump()
    log("answer", **fields)
    return fields


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    log("call", tool="add")
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    log("call", tool="echo")
    return text


@server.tool()
def delete_item(item: str) -> str:
    """Delete an item."""
    log("call", tool="delete_item", item=item)
    return f"deleted {item}"


@server.tool()
def refund(amount: int) -> str:
    """Issue a refund."""
    log("call", tool="refund", amount=amount)
    return f"refunded {amount}"


@server.tool()
async def ask_name(ctx: Context, greeting: str = "Hello") -> str:
    """Ask the user's name (elicitation/create, mid-call)."""
    log("call", tool="ask_name")
    try:
        result = await ctx.elicit("What is your name?", Name)
    except asyncio.CancelledError:
        log("cancelled", tool="ask_name")
        raise
    outcome("ask_name", result)
    if result.action == "accept":
        return f"{greeting}, {result.data.name}!"
    return f"no name given ({result.action})"


@server.tool()
async def ask_twice(ctx: Context) -> str:
    """Ask a name, then an age."""
    log("call", tool="ask_twice")
    name = await ctx.elicit("What is your name?", Name)
    outcome("ask_twice", name)
    age = await ctx.elicit("How old are you?", Age)
    outcome("ask_twice", age)
    return f"{name.action}/{age.action}"


@server.tool()
async def ask_colour(ctx: Context) -> str:
    """Ask a question worded differently on every call."""
    log("call", tool="ask_colour")
    result = await ctx.elicit(f"Pick a colour (ticket {uuid.uuid4().hex[:6]})", Colour)
    outcome("ask_colour", result)
    return f"colour: {result.data.colour}" if result.action == "accept" else result.action


@server.tool()
async def login(ctx: Context) -> str:
    """Ask the user to sign in on a web page (url-mode elicitation)."""
    log("call", tool="login")
    result = await ctx.elicit_url(
        "Sign in to the demo service", "https://auth.example/login", uuid.uuid4().hex
    )
    outcome("login", result)
    return f"login {result.action}"


def ask_confirmation(item: str) -> Elicit[Confirm]:
    return Elicit(f"Really archive {item}?", Confirm)


@server.tool()
async def archive(
    item: str, confirmed: Annotated[ElicitationResult[Confirm], Resolve(ask_confirmation)]
) -> str:
    """Archive an item once the user confirms (a resolver: both protocol eras)."""
    fields = outcome("archive", confirmed)
    if fields["action"] == "accept" and fields["content"]["confirm"]:
        return f"archived {item}"
    return f"kept {item} ({fields['action']})"


@server.tool()
def fail() -> str:
    """Always fails."""
    log("call", tool="fail")
    raise ToolError("the disk is full")


@server.tool()
def crash() -> str:
    """Kills the server mid-call."""
    log("call", tool="crash")
    print("demo server: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    log("call", tool="slow")
    await asyncio.sleep(seconds)
    return "slept"


def guarded(app: Any, token: str) -> Any:
    """Refuse HTTP requests that do not carry `X-Demo-Token: <token>`."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and dict(scope["headers"]).get(b"x-demo-token") != token.encode()
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"missing token"})
            return
        await app(scope, receive, send)

    return asgi


def serve_http(kind: str) -> None:
    import uvicorn

    app = server.streamable_http_app() if kind == "http" else server.sse_app()
    token = os.environ.get("DEMO_MCP_TOKEN")
    if token:
        app = guarded(app, token)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    log("start", transport=sys.argv[1] if len(sys.argv) > 1 else "stdio")
    if len(sys.argv) > 1 and sys.argv[1] in ("http", "sse"):
        serve_http(sys.argv[1])
    else:
        server.run()
