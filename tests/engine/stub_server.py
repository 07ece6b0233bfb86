"""Real HTTP servers on loopback, for tests that must cross a socket.

- `StubModelServer`: a threaded server that plays a scripted model (OpenAI or Anthropic
  style), as the Go seed does with httptest. Every request body is recorded so tests can
  assert what the model saw.
- `Server` (with `serve`): an asyncio server whose connections are scripted byte by byte
  (`handler(reader, writer, index)`), for what a well-behaved server never does: hang up
  after reading a request, answer half a response, never answer, close idle connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = Callable[[dict[str, Any], int], Any]


class StubModelServer:
    """`reply(body, turn)` returns the JSON to send (a dict), or a (status, dict, headers) tuple."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                stub.bodies.append(body)
                stub.paths.append(self.path)
                stub.headers.append({k.lower(): v for k, v in self.headers.items()})
                out = stub.reply(body, len(stub.bodies))
                status, payload, extra = out if isinstance(out, tuple) else (200, out, {})
                data = json.dumps(payload).encode()
                head = [
                    f"HTTP/1.1 {status} X",
                    "Content-Type: application/json",
                    f"Content-Length: {len(data)}",
                ]
                head += [f"{k}: {v}" for k, v in extra.items()]
                # One write: headers and body apart would meet Nagle + delayed ACK (~40 ms).
                self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> StubModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


# -- a scripted HTTP/1.1 server --------------------------------------------------------------


@dataclass
class Req:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@dataclass
class Server:
    """`handler(reader, writer, index)` runs per accepted connection (index from 1)."""

    handler: Handler
    ssl_context: ssl.SSLContext | None = None
    connections: int = 0
    requests: list[Req] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", 0, ssl=self.ssl_context
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            await self.handler(reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def read(self, reader: asyncio.StreamReader) -> Req | None:
        """One request, or None when the client closed the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        first, *lines = head.decode("latin-1").split("\r\n")
        method, target, _ = first.split(" ")
        headers = {}
        for line in filter(None, lines):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            parts = []
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            await reader.readuntil(b"\r\n")  # no trailers in these requests
            body = b"".join(parts)
        else:
            body = b""
        req = Req(method, target, headers, body)
        self.requests.append(req)
        return req


@contextlib.asynccontextmanager
async def serve(make: Callable[[Server], Handler]) -> AsyncIterator[Server]:
    """`async with serve(lambda srv: handler) as srv:` a scripted server on a free port."""
    srv = Server(handler=None)  # type: ignore[arg-type]
    srv.handler = make(srv)
    async with srv:
        yield srv


def reply(status: int = 200, body: bytes = b"", *headers: str, reason: str = "OK") -> bytes:
    """A whole HTTP/1.1 response in bytes (Content-Length framed)."""
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
