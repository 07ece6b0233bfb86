"""Deterministic OpenAI-compatible mock model for the engine overhead benchmark.

Stateless on purpose: the turn is read from the request body, so any number of clients
(keep-alive or one connection per request) can share one server.

- no message with role "tool" in the body  -> turn 1: two parallel tool calls (add, echo)
- a message with role "tool" in the body   -> turn 2: final text built from the tool outputs

The final text is "results: <out1> | <out2>" (tool outputs in message order), so a client
can check that its loop really ran both tools and sent their results back.

A request that offers a tool named "task" (a delegating agent, bench/agents_overhead.py) is
answered differently: with no tool message, one `task` call delegating the last user message
to the agent "worker"; with one, the final text "delegated: <its output>".

Run it alone:  python bench/mock_llm.py [--host 127.0.0.1] [--port 0]
It prints "READY <port>" on stdout once it listens, then serves until killed.

Built on asyncio.Protocol rather than http.server: each response goes out in ONE write with
TCP_NODELAY set, because writing headers and body separately on a keep-alive connection
costs ~40 ms per response (Nagle's algorithm meets delayed ACK), and the benchmark would
measure the kernel instead of the client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
from typing import Any

TOOL_CALLS: list[dict[str, Any]] = [
    {
        "id": "call_add_1",
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})},
    },
    {
        "id": "call_echo_2",
        "type": "function",
        "function": {"name": "echo", "arguments": json.dumps({"text": "hello"})},
    },
]
USAGE = {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}
EXPECTED_TEXT = "results: 5 | hello"

_MAX_HEAD = 64 * 1024


def _completion(model: str, message: dict[str, Any], finish_reason: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": USAGE,
        },
        separators=(",", ":"),
    ).encode()


def answer(body: bytes) -> tuple[int, bytes]:
    """Map one /chat/completions request body to (status, response body)."""
    try:
        req = json.loads(body)
        messages = req["messages"]
        model = str(req.get("model") or "mock")
    except (ValueError, KeyError, TypeError) as exc:
        return 400, json.dumps({"error": {"message": f"bad request: {exc}"}}).encode()
    tool_outputs = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
    if any((t.get("function") or {}).get("name") == "task" for t in req.get("tools") or []):
        return 200, _delegate(model, messages, tool_outputs)
    if not tool_outputs:
        msg = {"role": "assistant", "content": None, "tool_calls": TOOL_CALLS}
        return 200, _completion(model, msg, "tool_calls")
    msg = {"role": "assistant", "content": "results: " + " | ".join(tool_outputs)}
    return 200, _completion(model, msg, "stop")


def _delegate(model: str, messages: list[dict[str, Any]], tool_outputs: list[str]) -> bytes:
    if tool_outputs:
        msg = {"role": "assistant", "content": "delegated: " + tool_outputs[-1]}
        return _completion(model, msg, "stop")
    prompt = next(m.get("content") for m in reversed(messages) if m.get("role") == "user")
    call = {
        "id": "call_task_1",
        "type": "function",
        "function": {
            "name": "task",
            "arguments": json.dumps({"agent": "worker", "prompt": prompt}),
        },
    }
    msg = {"role": "assistant", "content": None, "tool_calls": [call]}
    return _completion(model, msg, "tool_calls")


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 411: "Length Required"}


def _response(status: int, body: bytes, keep_alive: bool) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _HttpProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 server side: Content-Length bodies, keep-alive, pipelining-safe."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # asyncio already sets this on TCP transports; set it again so the Nagle
            # pitfall cannot come back if that default ever changes.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while self._transport is not None and not self._transport.is_closing():
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    self._transport.close()
                return
            lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split()
            if len(parts) != 3:
                self._transport.close()
                return
            method, path, version = parts
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if len(self._buf) < end + 4 + length:
                return  # wait for the rest of the body
            body = bytes(self._buf[end + 4 : end + 4 + length])
            del self._buf[: end + 4 + length]

            conn = headers.get("connection", "").lower()
            keep_alive = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
            if method == "POST" and path.rstrip("/").endswith("/chat/completions"):
                if "transfer-encoding" in headers:
                    status, out = 411, b'{"error":{"message":"send Content-Length"}}'
                    keep_alive = False
                else:
                    status, out = answer(body)
            elif method == "GET" and path == "/health":
                status, out = 200, b'{"ok":true}'
            else:
                status, out = 404, b'{"error":{"message":"not found"}}'
            self._transport.write(_response(status, out, keep_alive))  # one write
            if not keep_alive:
                self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_HttpProtocol, host, port, backlog=128)
    bound = server.sockets[0].getsockname()[1]
    print(f"READY {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    ap.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    args = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C when run by hand
        asyncio.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
