"""toolnexus.model_http: the model over HTTP, through real sockets on loopback.

Most tests run on both transports the engine can use for its own client: httpx-aiohttp's
(the default) and httpx's own (`TOOLNEXUS_HTTP_TRANSPORT=httpx`). The rule under test: a
POST is retried only when it cannot have reached the model (no connection could be made,
or the endpoint answered a retryable status); once it may have, it is never sent again.
"""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest

from toolnexus import ModelError, create_client, create_toolkit
from toolnexus.dialects import OPENAI
from toolnexus.model_http import (
    DEFAULT_LIMITS,
    TRANSPORT_ENV,
    HTTPModel,
    engine_transport,
    nothing_sent,
    with_retries,
)

from .stub_server import Handler, Server, StubModelServer, reply, serve

aiohttp = pytest.importorskip("aiohttp")
httpx_aiohttp = pytest.importorskip("httpx_aiohttp")

TRANSPORTS = {"aiohttp": httpx_aiohttp.AiohttpTransport, "httpx": httpx.AsyncHTTPTransport}


def _clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.lower() in ("http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.delenv(name)


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test on each transport of the engine's own client."""
    _clear_proxies(monkeypatch)
    monkeypatch.setenv(TRANSPORT_ENV, request.param)
    return request.param


def openai_reply(text: str) -> dict:
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def engine(url: str, **options):
    options.setdefault("retries", 2)
    options.setdefault("retry_base_ms", 1)
    return create_client(base_url=url, model="m", api_key="k", **options)


def answer_json(text: str = "hi") -> bytes:
    return reply(200, json.dumps(openai_reply(text)).encode(), "Content-Type: application/json")


def keep_alive(srv: Server) -> Handler:
    """Answers every request on a connection until the client closes it."""

    async def handler(reader, writer, _):
        while await srv.read(reader) is not None:
            writer.write(answer_json())
            await writer.drain()

    return handler


# -- which transport ------------------------------------------------------------------------


def test_the_default_transport_is_httpx_aiohttp(monkeypatch):
    _clear_proxies(monkeypatch)
    monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    assert isinstance(engine_transport(), httpx_aiohttp.AiohttpTransport)


def test_httpx_own_transport_on_request(monkeypatch):
    _clear_proxies(monkeypatch)
    monkeypatch.setenv(TRANSPORT_ENV, "httpx")
    assert isinstance(engine_transport(), httpx.AsyncHTTPTransport)


@pytest.mark.parametrize("name", ["HTTP_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"])
def test_a_proxy_leaves_the_client_to_httpx_which_honours_it(monkeypatch, name):
    _clear_proxies(monkeypatch)
    monkeypatch.setenv(name, "http://proxy.invalid:3128")
    assert engine_transport() is None


async def test_the_engine_client_is_pooled_capped_and_on_the_chosen_transport(transport):
    model = engine("http://127.0.0.1:9").backend
    try:
        http = model.http_client()
        assert http is model.http_client()  # one pooled client per event loop
        assert isinstance(http._transport, TRANSPORTS[transport])
        assert model.limits is DEFAULT_LIMITS and DEFAULT_LIMITS.max_connections == 100
    finally:
        await model.aclose()


async def test_an_injected_client_is_used_as_it_is_and_not_closed():
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=openai_reply("hi"))

    http = httpx.AsyncClient(transport=httpx.MockTransport(handle), headers={"x-tenant": "t1"})
    async with await create_toolkit(builtins=False) as tk:
        async with engine("http://model.test/v1", http_client=http) as client:
            assert (await client.run("go", tk)).text == "hi"
    assert seen[0].headers["x-tenant"] == "t1"  # the client's own defaults apply
    assert seen[0].headers["authorization"] == "Bearer k"
    assert not http.is_closed
    await http.aclose()


# -- the engine over real sockets -----------------------------------------------------------


async def test_stub_model_server_through_the_engine(transport):
    def model(body, turn):
        return {"choices": [{"message": {"role": "assistant", "content": f"turn {turn}"}}]}

    with StubModelServer(model) as srv:
        async with await create_toolkit(builtins=False) as tk, engine(srv.url) as client:
            for turn in range(1, 4):
                assert (await client.run("hi", tk)).text == f"turn {turn}"
    assert srv.paths == ["/chat/completions"] * 3
    assert srv.headers[0]["authorization"] == "Bearer k"
    assert srv.headers[0]["content-type"] == "application/json"


async def test_runs_share_one_keep_alive_connection(transport):
    async with serve(keep_alive) as srv:
        async with await create_toolkit(builtins=False) as tk, engine(srv.url) as client:
            for _ in range(3):
                assert (await client.run("hi", tk)).text == "hi"
    assert srv.connections == 1 and len(srv.requests) == 3


async def test_a_non_ascii_prompt_travels_as_utf8(transport):
    async with serve(keep_alive) as srv:
        async with await create_toolkit(builtins=False) as tk, engine(srv.url) as client:
            await client.run("héllo → 世界", tk)
    body = srv.requests[0].body
    assert "héllo → 世界".encode() in body  # not \\u-escaped
    assert json.loads(body)["messages"][-1]["content"] == "héllo → 世界"


async def test_server_closing_an_idle_connection_is_transparent(transport):
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await srv.read(reader)
            writer.write(answer_json())  # then close: a keep-alive timeout on the server
            await writer.drain()

        return handler

    async with serve(make) as srv:
        async with await create_toolkit(builtins=False) as tk, engine(srv.url) as client:
            assert (await client.run("one", tk)).text == "hi"
            await asyncio.sleep(0.05)  # the FIN has arrived while idle
            assert (await client.run("two", tk)).text == "hi"
    assert srv.connections == 2 and len(srv.requests) == 2


async def test_connections_are_capped_by_the_limits(transport):
    in_flight = 0
    most = 0

    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            nonlocal in_flight, most
            while await srv.read(reader) is not None:
                in_flight += 1
                most = max(most, in_flight)
                await asyncio.sleep(0.02)
                in_flight -= 1
                writer.write(answer_json())
                await writer.drain()

        return handler

    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    async with serve(make) as srv:
        async with (
            await create_toolkit(builtins=False) as tk,
            engine(srv.url, limits=limits) as client,
        ):
            results = await asyncio.gather(*(client.run(f"p{i}", tk) for i in range(6)))
    assert [r.text for r in results] == ["hi"] * 6
    assert srv.connections <= 2 and most <= 2 and len(srv.requests) == 6


async def test_aclose_closes_pooled_connections(transport):
    closed = asyncio.Event()

    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await keep_alive(srv)(reader, writer, _)
            closed.set()

        return handler

    async with serve(make) as srv, await create_toolkit(builtins=False) as tk:
        client = engine(srv.url)
        await client.run("hi", tk)
        assert not closed.is_set()
        await client.aclose()
        await asyncio.wait_for(closed.wait(), 2)


def test_run_sync_twice_gets_a_fresh_pool_per_event_loop(transport):
    def model(body, turn):
        return openai_reply(f"turn {turn}")

    async def kit():
        return await create_toolkit(builtins=False)

    with StubModelServer(model) as srv:
        client = engine(srv.url)
        tk = asyncio.run(kit())
        assert client.run_sync("a", tk).text == "turn 1"
        assert client.run_sync("b", tk).text == "turn 2"


# -- what is retried, and what never is ------------------------------------------------------


async def test_a_post_the_server_read_is_never_sent_again(transport):
    """The server reads the whole request, then hangs up without a byte of response."""

    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await srv.read(reader)

        return handler

    async with serve(make) as srv, await create_toolkit(builtins=False) as tk:
        async with engine(srv.url, retries=3) as client:
            with pytest.raises(ModelError, match="not retried") as info:
                await client.run("bill me once", tk)
    assert len(srv.requests) == 1 and srv.connections == 1
    assert json.loads(srv.requests[0].body)["messages"][-1]["content"] == "bill me once"
    assert info.value.retryable is False


async def test_a_reused_connection_dropped_after_the_post_is_not_sent_again(transport):
    """Keep-alive connection: the first run is served; the second run's POST is read and
    the connection dropped before any response byte."""

    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            while await srv.read(reader) is not None:
                if len(srv.requests) == 2:
                    return
                writer.write(answer_json())
                await writer.drain()

        return handler

    async with serve(make) as srv, await create_toolkit(builtins=False) as tk:
        async with engine(srv.url, retries=3) as client:
            assert (await client.run("one", tk)).text == "hi"
            with pytest.raises(ModelError, match="not retried"):
                await client.run("two", tk)
    assert len(srv.requests) == 2 and srv.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choices"',
        b"HTTP/1.1 200 OK\r\nContent-Le",
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
    ids=["truncated-body", "truncated-head", "garbage"],
)
async def test_a_broken_response_is_not_retried(transport, answer):
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await srv.read(reader)
            writer.write(answer)  # then the connection closes
            await writer.drain()

        return handler

    async with serve(make) as srv, await create_toolkit(builtins=False) as tk:
        async with engine(srv.url, retries=3) as client:
            with pytest.raises(ModelError):
                await client.run("hi", tk)
    assert len(srv.requests) == 1


async def test_a_read_timeout_is_not_retried(transport):
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            await srv.read(reader)
            await asyncio.Event().wait()  # never answers

        return handler

    async with serve(make) as srv, await create_toolkit(builtins=False) as tk:
        async with engine(srv.url, retries=3, request_timeout=0.2) as client:
            with pytest.raises(ModelError, match=r"[Tt]imeout"):
                await client.run("hi", tk)
    assert len(srv.requests) == 1


async def test_a_retryable_status_is_retried_over_the_same_connection(transport):
    def make(srv: Server) -> Handler:
        async def handler(reader, writer, _):
            while await srv.read(reader) is not None:
                if len(srv.requests) < 3:
                    writer.write(reply(503, b"busy", "Retry-After: 0"))
                else:
                    writer.write(answer_json())
                await writer.drain()

        return handler

    async with serve(make) as srv, await create_toolkit(builtins=False) as tk:
        async with engine(srv.url, retries=2) as client:
            assert (await client.run("hi", tk)).text == "hi"
    assert len(srv.requests) == 3 and srv.connections == 1


async def test_a_failed_connect_is_retried(transport, monkeypatch):
    """Nothing reached the server: the connection was refused twice, the third try works."""
    loop = asyncio.get_running_loop()
    connect = loop.create_connection
    attempts = 0

    async def flaky(*args, **kwargs):
        nonlocal attempts
        attempts += 1
        if attempts <= 2:
            if kwargs.get("sock") is not None:
                kwargs["sock"].close()  # as a refused connect leaves it
            raise ConnectionRefusedError(111, "Connection refused")
        return await connect(*args, **kwargs)

    async with serve(keep_alive) as srv, await create_toolkit(builtins=False) as tk:
        monkeypatch.setattr(loop, "create_connection", flaky)
        async with engine(srv.url, retries=2) as client:
            assert (await client.run("hi", tk)).text == "hi"
    assert attempts == 3 and len(srv.requests) == 1


async def test_an_unreachable_endpoint_fails_after_its_retries(transport):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    async with await create_toolkit(builtins=False) as tk:
        async with engine(f"http://127.0.0.1:{port}", retries=1) as client:
            with pytest.raises(ModelError, match="unreachable") as info:
                await client.run("hi", tk)
    assert info.value.retryable is True


# -- the same rules on an injected client (httpx.MockTransport) -------------------------------


def _sse(*events: dict) -> list[bytes]:
    return [f"data: {json.dumps(e)}\n\n".encode() for e in events]


async def test_a_stream_broken_midway_is_not_retried_and_no_text_repeats():
    attempts = 0

    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self):
            for part in _sse(
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]}
            ):
                yield part
            raise httpx.ReadError("connection reset")

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken())

    http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    events = []
    async with await create_toolkit(builtins=False) as tk:
        client = engine("http://model.test/v1", http_client=http, retries=3)
        with pytest.raises(ModelError, match="not retried"):
            async for event in client.stream("hi", tk):
                events.append(event)
    await http.aclose()
    assert attempts == 1
    assert [e["delta"] for e in events if e["type"] == "text"] == ["Hel"]


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, content=b'{"choices": [{"message": {"role": "assis'),
        httpx.Response(200, json={"id": "x", "object": "chat.completion"}),
        httpx.Response(200, json=[1, 2]),
    ],
    ids=["invalid-json", "no-message", "not-an-object"],
)
async def test_a_2xx_reply_that_cannot_be_used_is_not_retried(response):
    attempts = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        return response

    http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    async with await create_toolkit(builtins=False) as tk:
        with pytest.raises(ModelError) as info:
            await engine("http://model.test/v1", http_client=http, retries=3).run("hi", tk)
    await http.aclose()
    assert attempts == 1 and not info.value.retryable


@pytest.mark.parametrize(
    "error, retried",
    [
        (httpx.ConnectError("refused"), True),
        (httpx.ConnectTimeout("slow connect"), True),
        (httpx.PoolTimeout("no free connection"), True),
        (httpx.ReadTimeout("slow model"), False),
        (httpx.ReadError("reset"), False),
        (httpx.WriteError("broken pipe"), False),
        (httpx.RemoteProtocolError("server disconnected"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
async def test_transport_errors_are_retried_only_before_sending(error, retried):
    attempts = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        raise error

    http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    async with await create_toolkit(builtins=False) as tk:
        with pytest.raises(ModelError, match=type(error).__name__):
            await engine("http://model.test/v1", http_client=http, retries=2).run("hi", tk)
    await http.aclose()
    assert attempts == (3 if retried else 1)


# -- the pieces ------------------------------------------------------------------------------


def _mapped(cause: BaseException, as_: type[httpx.TransportError]) -> httpx.TransportError:
    """An httpx error raised from an aiohttp one, as httpx-aiohttp raises them."""
    try:
        try:
            raise cause
        except Exception as exc:
            raise as_(str(exc)) from exc
    except httpx.TransportError as mapped:
        return mapped


def test_nothing_sent_judges_aiohttp_errors_by_their_own_class():
    key = aiohttp.client_reqrep.ConnectionKey("h", 80, False, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, OSError(111, "refused"))
    assert nothing_sent(_mapped(refused, httpx.ConnectError))
    assert nothing_sent(_mapped(aiohttp.ConnectionTimeoutError("connect"), httpx.ConnectTimeout))
    # httpx-aiohttp maps every connection error to ConnectTimeout, a hang-up after the
    # request was read included: that one was sent.
    gone = aiohttp.ServerDisconnectedError()
    assert not nothing_sent(_mapped(gone, httpx.ConnectTimeout))
    assert not nothing_sent(_mapped(aiohttp.ClientOSError(104, "reset"), httpx.ConnectTimeout))
    assert not nothing_sent(_mapped(aiohttp.SocketTimeoutError("read"), httpx.ReadTimeout))
    assert not nothing_sent(aiohttp.ClientPayloadError("cut"))


async def test_with_retries_honours_retry_after_then_backs_off(monkeypatch):
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    failures = [
        ModelError("busy", retryable=True, retry_after=7),
        ModelError("busy", retryable=True),
        ModelError("busy", retryable=True),
    ]

    async def attempt() -> str:
        if failures:
            raise failures.pop(0)
        return "ok"

    assert await with_retries(attempt, 3, 0.5) == "ok"
    assert slept[0] == 7  # the endpoint's Retry-After, as asked
    assert 0.5 <= slept[1] <= 1.0 and 1.0 <= slept[2] <= 2.0  # base x 2^n, jittered


async def test_with_retries_stops_at_a_non_retryable_error_and_at_the_limit():
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        raise ModelError("no", retryable=calls > 1)

    with pytest.raises(ModelError):
        await with_retries(attempt, 5, 0)
    assert calls == 1

    calls = 1  # from now on every failure is retryable

    async def always() -> str:
        nonlocal calls
        calls += 1
        raise ModelError("busy", retryable=True)

    with pytest.raises(ModelError):
        await with_retries(always, 2, 0)
    assert calls == 4  # the first try and two retries


@pytest.mark.parametrize(
    "value, expected", [("0", 0), ("12", 12), ("99999999999", 2147483647), ("soon", None)]
)
async def test_retry_after_is_read_as_plain_seconds(value, expected):
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": value}, text="slow down")

    http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    model = HTTPModel(dialect=OPENAI, url="http://m.test", http_client=http, retries=0)
    with pytest.raises(ModelError) as info:
        await model.complete({"model": "m", "messages": []}, None)
    await http.aclose()
    assert info.value.status == 429 and info.value.retryable
    assert info.value.retry_after == expected
