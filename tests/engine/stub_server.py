"""A real HTTP server on loopback that plays a scripted model (OpenAI or Anthropic style).

Used where a test must cross a socket, as the Go seed does with httptest. Every request
body is recorded so tests can assert what the model saw.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
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
