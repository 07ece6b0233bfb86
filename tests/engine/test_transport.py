"""toolnexus.transport.LeanTransport against small scripted servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import pytest

from toolnexus import create_client, create_toolkit
from toolnexus.transport import LeanTransport, default_transport

from .stub_server import StubModelServer

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


def reply(status: int = 200, body: bytes = b"", *headers: str, reason: str = "OK") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def keep_alive(answer: Callable[[Req], bytes | Awaitable[bytes]]) -> Callable[[Server], Handler]:
    """A handler serving requests on one connection until the client closes it."""

    def make(srv: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int):
            while (req := await srv.read(reader)) is not None:
                out = answer(req)
                writer.write(await out if not isinstance(out, bytes) else out)
                await writer.drain()

        return handler

    return make


@contextlib.asynccontextmanager
async def serve(make: Callable[[Server], Handler]) -> AsyncIterator[Server]:
    srv = Server(handler=None)  # type: ignore[arg-type]
    srv.handler = make(srv)
    async with srv:
        yield srv


@contextlib.asynccontextmanager
async def client(srv: Server, **options) -> AsyncIterator[httpx.AsyncClient]:
    timeout = options.pop("timeout", 5.0)
    async with httpx.AsyncClient(
        transport=LeanTransport(**options), base_url=srv.url, timeout=timeout
    ) as http:
        yield http


def echo_path(req: Req) -> bytes:
    return reply(200, req.target.encode(), "Content-Type: text/plain")


# -- bodies ----------------------------------------------------------------------------------


async def test_content_length_response_keeps_repeated_headers():
    answer = reply(200, b"hello", "Set-Cookie: a=1", "Set-Cookie: b=2", "X-Folded: one")
    async with serve(keep_alive(lambda req: answer)) as srv, client(srv) as http:
        r = await http.get("/x?q=1")
    assert r.status_code == 200
    assert r.content == b"hello"
    assert r.headers.get_list("set-cookie") == ["a=1", "b=2"]
    assert r.http_version == "HTTP/1.1" and r.reason_phrase == "OK"
    req = srv.requests[0]
    assert (req.method, req.target) == ("GET", "/x?q=1")
    assert req.headers["host"] == f"127.0.0.1:{srv.port}"


async def test_chunked_response_with_extensions_and_trailers_then_reuse():
    body = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
        + chunk(b"hello ")
        + b"5;ext=1\r\nworld\r\n"
        + chunk(b"!" * 3000)
        + b"0\r\nX-Sum: 42\r\nX-Other: y\r\n\r\n"
    )
    async with serve(keep_alive(lambda req: body)) as srv, client(srv) as http:
        first = await http.get("/a")
        second = await http.get("/b")  # the trailers were consumed: the next head parses
    assert first.content == second.content == b"hello world" + b"!" * 3000
    assert srv.connections == 1


async def test_chunked_trailers_are_kept_on_the_stream():
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await srv.read(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"ab"))
            await writer.drain()
            await asyncio.sleep(0.02)  # the end arrives after the head: a streamed body
            writer.write(b"0\r\nX-Sum: 2\r\n\r\n")
            await writer.drain()
            await reader.read()

        return handler

    async with serve(make) as srv, LeanTransport() as transport:
        r = await transport.handle_async_request(httpx.Request("GET", srv.url))
        assert await r.aread() == b"ab"
        assert r.stream.trailers == [(b"X-Sum", b"2")]


async def test_streamed_sse_lines_arrive_before_the_body_ends():
    release = asyncio.Event()

    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            while await srv.read(reader) is not None:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n" + chunk(b"data: one\n\n")
                )
                await writer.drain()
                await release.wait()
                writer.write(chunk(b"data: two\n\n") + b"0\r\n\r\n")
                await writer.drain()

        return handler

    async with serve(make) as srv, client(srv) as http:
        async with http.stream("POST", "/sse", content=b"{}") as response:
            lines = response.aiter_lines()
            assert await asyncio.wait_for(anext(lines), 2) == "data: one"
            assert not release.is_set()  # the server still holds the rest of the body
            release.set()
            rest = [line async for line in lines]
        assert [line for line in rest if line] == ["data: two"]
        assert (await http.get("/again")).status_code == 200
    assert srv.connections == 1  # fully read: the connection went back to the pool


async def test_stream_closed_early_closes_the_connection_unless_the_rest_arrived():
    whole = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"data: a\n\n")

    def make(srv: Server) -> Handler:
        async def handler(reader, writer, index):
            while (req := await srv.read(reader)) is not None:
                if req.target == "/complete":  # the terminator comes in the same write
                    writer.write(whole + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                else:  # the terminator never comes
                    writer.write(whole + chunk(b"data: [DONE]\n\n"))
                await writer.drain()

        return handler

    async with serve(make) as srv, client(srv) as http:
        for _ in range(2):
            async with http.stream("GET", "/complete") as response:
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        break
        assert srv.connections == 1
        async with http.stream("GET", "/open") as response:
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    break
        async with http.stream("GET", "/complete") as response:
            await response.aread()
    assert srv.connections == 2


async def test_large_response_with_a_slow_reader_arrives_intact():
    big = os.urandom(3 * 1024 * 1024)  # more than the transport buffers before pausing
    async with serve(keep_alive(lambda req: reply(200, big))) as srv, client(srv) as http:
        for _ in range(2):
            async with http.stream("GET", "/") as response:
                parts = []
                async for part in response.aiter_raw():
                    if not parts:
                        await asyncio.sleep(0.05)  # the socket fills the buffer, then pauses
                    parts.append(part)
            assert b"".join(parts) == big
    assert srv.connections == 1


async def test_head_204_304_have_no_body_and_keep_the_connection():
    def answer(req: Req) -> bytes:
        if req.method == "HEAD":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
        if req.target == "/204":
            return b"HTTP/1.1 204 No Content\r\n\r\n"
        if req.target == "/304":
            return b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n"
        return reply(200, b"after")

    async with serve(keep_alive(answer)) as srv, client(srv) as http:
        head = await http.head("/")
        no_content = await http.get("/204")
        not_modified = await http.get("/304")
        after = await http.get("/x")
    assert head.content == no_content.content == not_modified.content == b""
    assert head.headers["content-length"] == "5"
    assert after.content == b"after"
    assert srv.connections == 1


@pytest.mark.parametrize("version", ["HTTP/1.0", "HTTP/1.1"])
async def test_body_without_length_is_read_until_close(version):
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await srv.read(reader)
            writer.write(f"{version} 200 OK\r\nContent-Type: text/plain\r\n\r\n".encode())
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(b"hello world")  # then the connection closes

        return handler

    async with serve(make) as srv, client(srv) as http:
        assert (await http.get("/")).text == "hello world"
        assert (await http.get("/")).text == "hello world"
    assert srv.connections == 2


async def test_informational_response_is_skipped():
    answer = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + reply(200, b"real")
    async with serve(keep_alive(lambda req: answer)) as srv, client(srv) as http:
        r = await http.get("/")
    assert (r.status_code, r.content) == (200, b"real")


# -- connections -----------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection():
    async with serve(keep_alive(echo_path)) as srv, client(srv) as http:
        texts = [(await http.get(f"/r{i}")).text for i in range(10)]
    assert texts == [f"/r{i}" for i in range(10)]
    assert srv.connections == 1


async def test_concurrent_requests_each_get_a_connection_then_reuse_them():
    async def slow(req: Req) -> bytes:
        await asyncio.sleep(0.05)  # keeps all ten in flight together
        return echo_path(req)

    async with serve(keep_alive(slow)) as srv, client(srv) as http:
        for _ in range(2):
            rs = await asyncio.gather(*(http.get(f"/c{i}") for i in range(10)))
            assert [r.text for r in rs] == [f"/c{i}" for i in range(10)]
    assert srv.connections == 10


async def test_idle_cap_and_idle_expiry():
    async def slow(req: Req) -> bytes:
        await asyncio.sleep(0.03)
        return echo_path(req)

    async with serve(keep_alive(slow)) as srv, client(srv, max_idle_per_host=2) as http:
        for _ in range(2):
            await asyncio.gather(*(http.get("/") for _ in range(5)))
    assert srv.connections == 5 + 3  # only two were kept

    async with serve(keep_alive(echo_path)) as srv, client(srv, idle_timeout=0.05) as http:
        await http.get("/")
        await asyncio.sleep(0.1)
        await http.get("/")
    assert srv.connections == 2


async def test_connection_close_response_is_not_reused():
    answer = reply(200, b"bye", "Connection: close")
    async with serve(keep_alive(lambda req: answer)) as srv, client(srv) as http:
        for _ in range(3):
            assert (await http.get("/")).content == b"bye"
    assert srv.connections == 3


async def test_http10_response_without_keep_alive_is_not_reused():
    answer = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with serve(keep_alive(lambda req: answer)) as srv, client(srv) as http:
        await http.get("/")
        await http.get("/")
    assert srv.connections == 2


async def test_server_closing_an_idle_connection_is_transparent():
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            req = await srv.read(reader)
            writer.write(echo_path(req))  # then close: a keep-alive timeout on the server
            await writer.drain()

        return handler

    async with serve(make) as srv, client(srv) as http:
        assert (await http.get("/1")).text == "/1"
        await asyncio.sleep(0.05)  # the FIN has arrived while idle
        assert (await http.get("/2")).text == "/2"
    assert srv.connections == 2


async def test_stale_connection_found_on_send_is_retried_once_with_the_same_body():
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, index):
            while (req := await srv.read(reader)) is not None:
                if index == 1 and len(srv.requests) == 2:
                    return  # closed just as the second request came: no response byte
                writer.write(reply(200, hashlib.sha256(req.body).hexdigest().encode()))
                await writer.drain()

        return handler

    body = os.urandom(4096)
    async with serve(make) as srv, client(srv) as http:
        assert (await http.post("/", content=body)).text == hashlib.sha256(body).hexdigest()
        assert (await http.post("/", content=body)).text == hashlib.sha256(body).hexdigest()
    assert srv.connections == 2
    assert [r.body for r in srv.requests] == [body, body, body]


async def test_stale_connection_with_a_consumed_stream_body_is_not_retried():
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, index):
            while await srv.read(reader) is not None:
                if len(srv.requests) == 2:
                    return
                writer.write(reply(200, b"ok"))
                await writer.drain()

        return handler

    async def gen() -> AsyncIterator[bytes]:
        yield b"part"

    async with serve(make) as srv, client(srv) as http:
        await http.get("/")
        with pytest.raises(httpx.TransportError):
            await http.post("/", content=gen())
    assert srv.connections == 1


async def test_no_retry_once_response_bytes_arrived():
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, index):
            while await srv.read(reader) is not None:
                if len(srv.requests) == 2:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")
                    return
                writer.write(reply(200, b"ok"))
                await writer.drain()

        return handler

    async with serve(make) as srv, client(srv) as http:
        await http.get("/")
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")
    assert srv.connections == 1


async def test_fresh_connection_closed_without_response_is_not_retried():
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, index):
            await srv.read(reader)

        return handler

    async with serve(make) as srv, client(srv) as http:
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await http.get("/")
    assert srv.connections == 1


async def test_aclose_closes_pooled_connections():
    closed = asyncio.Event()

    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            while (req := await srv.read(reader)) is not None:
                writer.write(echo_path(req))
                await writer.drain()
            closed.set()

        return handler

    async with serve(make) as srv:
        transport = LeanTransport()
        async with httpx.AsyncClient(transport=transport, base_url=srv.url) as http:
            await http.get("/")
            assert not closed.is_set()
        await asyncio.wait_for(closed.wait(), 2)


# -- failures --------------------------------------------------------------------------------


async def test_read_timeout():
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await srv.read(reader)
            await asyncio.Event().wait()  # never answers

        return handler

    async with serve(make) as srv, client(srv, timeout=httpx.Timeout(5, read=0.1)) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/")


async def test_read_timeout_mid_body():
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await srv.read(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await asyncio.Event().wait()

        return handler

    async with serve(make) as srv, client(srv, timeout=httpx.Timeout(5, read=0.1)) as http:
        async with http.stream("GET", "/") as response:
            with pytest.raises(httpx.ReadTimeout):
                await response.aread()


async def test_write_timeout():
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.Event().wait()  # never reads the body

        return handler

    async with serve(make) as srv, client(srv, timeout=httpx.Timeout(5, write=0.2)) as http:
        with pytest.raises(httpx.WriteTimeout):
            await http.post("/", content=b"x" * (32 * 1024 * 1024))


async def test_connect_timeout(monkeypatch):
    async def hang(*args, **kwargs):
        await asyncio.sleep(10)

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", hang)
    async with httpx.AsyncClient(
        transport=LeanTransport(), timeout=httpx.Timeout(5, connect=0.05)
    ) as http:
        with pytest.raises(httpx.ConnectTimeout):
            await http.get("http://127.0.0.1:9/")


async def test_connection_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    async with httpx.AsyncClient(transport=LeanTransport()) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Le",
    ],
    ids=["content-length", "chunked", "head"],
)
async def test_truncated_response_raises_a_transport_error(answer):
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await srv.read(reader)
            writer.write(answer)  # then the connection closes

        return handler

    async with serve(make) as srv, client(srv) as http:
        with pytest.raises(httpx.TransportError):
            await http.get("/")


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
    ],
    ids=["status-line", "status-code", "header", "content-length", "chunk-size", "chunk-crlf"],
)
async def test_protocol_garbage_raises_remote_protocol_error(answer):
    async with serve(keep_alive(lambda req: answer)) as srv, client(srv) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")


async def test_header_injection_is_refused():
    async with httpx.AsyncClient(transport=LeanTransport()) as http:
        with pytest.raises(httpx.LocalProtocolError):
            await http.get("http://127.0.0.1:9/", headers={"x-a": "1\r\nx-b: 2"})


# -- request bodies --------------------------------------------------------------------------


def digest(req: Req) -> bytes:
    return reply(200, f"{len(req.body)} {hashlib.sha256(req.body).hexdigest()}".encode())


async def test_one_megabyte_post_body_arrives_intact():
    body = os.urandom(1024 * 1024)
    async with serve(keep_alive(digest)) as srv, client(srv) as http:
        r = await http.post("/upload", content=body)
    assert r.text == f"{len(body)} {hashlib.sha256(body).hexdigest()}"
    assert srv.requests[0].headers["content-length"] == str(len(body))


async def test_streamed_request_body_is_sent_chunked():
    parts = [os.urandom(64 * 1024) for _ in range(8)]

    async def gen() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    async with serve(keep_alive(digest)) as srv, client(srv) as http:
        r = await http.post("/upload", content=gen())
        again = await http.get("/")  # the chunked terminator left the connection usable
    whole = b"".join(parts)
    assert r.text == f"{len(whole)} {hashlib.sha256(whole).hexdigest()}"
    assert srv.requests[0].headers["transfer-encoding"] == "chunked"
    assert again.status_code == 200 and srv.connections == 1


async def test_async_client_json_end_to_end():
    def answer(req: Req) -> bytes:
        payload = json.loads(req.body)
        data = json.dumps({"got": payload, "ctype": req.headers["content-type"]}).encode()
        return reply(200, data, "Content-Type: application/json")

    async with serve(keep_alive(answer)) as srv, client(srv) as http:
        r = await http.post("/v1/chat", json={"messages": [{"role": "user", "content": "hé"}]})
    r.raise_for_status()
    assert r.json() == {
        "got": {"messages": [{"role": "user", "content": "hé"}]},
        "ctype": "application/json",
    }


# -- the engine's own stub server, and the engine wiring -------------------------------------


async def test_stub_model_server_through_the_engine():
    def model(body, turn):
        return {"choices": [{"message": {"role": "assistant", "content": f"turn {turn}"}}]}

    with StubModelServer(model) as srv:
        http = httpx.AsyncClient(transport=LeanTransport())
        async with (
            await create_toolkit(builtins=False) as tk,
            create_client(base_url=srv.url, model="stub", api_key="k", http_client=http) as engine,
        ):
            for turn in range(1, 4):
                assert (await engine.run("hi", tk)).text == f"turn {turn}"
        await http.aclose()
    assert srv.paths == ["/chat/completions"] * 3
    assert srv.headers[0]["authorization"] == "Bearer k"


async def test_stub_model_server_with_plain_posts():
    with StubModelServer(lambda body, turn: {"turn": turn, "echo": body}) as srv:
        async with httpx.AsyncClient(transport=LeanTransport(), base_url=srv.url) as http:
            for i in range(5):
                r = await http.post("/x", json={"i": i})
                assert r.json() == {"turn": i + 1, "echo": {"i": i}}


def _clear_proxies(monkeypatch):
    for name in list(os.environ):
        if name.lower() in ("http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("TOOLNEXUS_HTTP_TRANSPORT", raising=False)


@pytest.mark.parametrize("name", ["HTTP_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"])
def test_default_transport_steps_aside_for_proxies(monkeypatch, name):
    _clear_proxies(monkeypatch)
    assert isinstance(default_transport(), LeanTransport)
    monkeypatch.setenv(name, "http://proxy.invalid:3128")
    assert default_transport() is None


def test_default_transport_opt_out(monkeypatch):
    _clear_proxies(monkeypatch)
    monkeypatch.setenv("TOOLNEXUS_HTTP_TRANSPORT", "httpx")
    assert default_transport() is None


async def test_engine_client_uses_the_lean_transport_without_proxies(monkeypatch):
    _clear_proxies(monkeypatch)
    engine = create_client(base_url="http://127.0.0.1:9", model="m", api_key="k")
    try:
        assert isinstance(engine._client()._transport, LeanTransport)
    finally:
        await engine.aclose()


# -- TLS -------------------------------------------------------------------------------------


def _self_signed(tmp_path) -> tuple[str, str]:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


async def test_https_with_sni_and_reuse(tmp_path):
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    names: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: names.append(name)

    srv = Server(handler=None, ssl_context=server_ctx)  # type: ignore[arg-type]
    srv.handler = keep_alive(echo_path)(srv)
    async with srv:
        url = f"https://localhost:{srv.port}"
        trusted = ssl.create_default_context(cafile=cert)
        async with httpx.AsyncClient(transport=LeanTransport(ssl_context=trusted)) as http:
            assert (await http.get(url + "/a")).text == "/a"
            assert (await http.get(url + "/b")).text == "/b"
        async with httpx.AsyncClient(transport=LeanTransport()) as http:
            with pytest.raises(httpx.ConnectError):  # not in the default trust store
                await http.get(url + "/c")
    assert names[0] == "localhost"
    assert srv.connections == 1  # both requests on one connection (the refused one never got in)
