"""The model over HTTP: the POST of each model turn, retries, and failures as `ModelError`.

Wire shapes (request bodies, replies, SSE streams) are the dialects' job (`dialects.py`);
this module only moves bytes and decides what may be tried again.

The connection pool: one `httpx.AsyncClient` per event loop (an injected `http_client` is
used as it is). The engine's own client runs on the `httpx-aiohttp` transport, the one
openai-python offers as its aiohttp client: measured side by side in bench/engine_overhead.py
it costs about half of httpx's own transport per model call. httpx's own transport is used
when `TOOLNEXUS_HTTP_TRANSPORT=httpx` or when httpx-aiohttp is not installed, and httpx's
default client (which honours them) when a proxy variable is set. Connections are capped by
`httpx.Limits` (`DEFAULT_LIMITS`, or `limits=`). The engine's own client sends its prepared
requests straight to that transport: its redirects, cookies, auth and event hooks are not
used for model calls.

Retries (`retries`, default 2; backoff `retry_base_ms` x 2^attempt with jitter, or the
endpoint's `Retry-After` in plain seconds) happen only where the model cannot have acted on
the request: an answer with a retryable status (429, 5xx, 408, 409, 425, 529), or a failure
while connecting (no connection could be made, or none was free in the pool). Once the
request may have reached the server, a failure (the connection dropped, a read timed out, a
truncated or unusable reply) is never retried: the endpoint may have processed, and billed,
the call. The run fails with a `ModelError` that says so, and the host decides.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import ssl
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import httpx

from .dialects import Dialect, ModelTurn
from .types import ModelError

__all__ = [
    "DEFAULT_LIMITS",
    "RETRY_STATUSES",
    "TRANSPORT_ENV",
    "HTTPModel",
    "engine_transport",
    "nothing_sent",
    "with_retries",
]

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
# httpx's own defaults, stated: at most 100 connections, 20 kept idle for 5 s.
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5)
TRANSPORT_ENV = "TOOLNEXUS_HTTP_TRANSPORT"  # "httpx": httpx's own transport
_PROXY_VARS = frozenset({"http_proxy", "https_proxy", "all_proxy"})
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
T = TypeVar("T")
Emit = Callable[[dict[str, Any]], None]


# -- retries --------------------------------------------------------------------------------


async def with_retries(attempt: Callable[[], Awaitable[T]], retries: int, base: float) -> T:
    """Run `attempt`, again on a retryable `ModelError`, at most `retries` more times."""
    tried = 0
    while True:
        try:
            return await attempt()
        except ModelError as exc:
            if not exc.retryable or tried >= retries:
                raise
            delay = exc.retry_after
            if delay is None:
                delay = base * (2**tried) * (0.5 + random.random() / 2)
            tried += 1
            await asyncio.sleep(delay)


def nothing_sent(exc: BaseException) -> bool:
    """True when a failed request certainly never reached the server: the connection could
    not be made, or no pooled connection became free in time."""
    aiohttp = sys.modules.get("aiohttp")
    cause = exc.__cause__ if isinstance(exc, httpx.TransportError) else exc
    if aiohttp is not None and isinstance(cause, aiohttp.ClientError):
        # httpx-aiohttp maps every aiohttp connection error to httpx.ConnectTimeout, a server
        # that hung up after reading the request included: judge by aiohttp's own class.
        return isinstance(cause, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError))
    return isinstance(exc, _UNSENT)


def _is_aiohttp_error(exc: BaseException) -> bool:
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def _transport_failure(exc: Exception) -> ModelError:
    cause = exc.__cause__
    shown = cause if cause is not None and _is_aiohttp_error(cause) else exc
    what = f"{type(shown).__name__}: {shown}"
    if nothing_sent(exc):
        return ModelError(f"model endpoint unreachable: {what}", retryable=True)
    return ModelError(
        f"model endpoint failed after the request was sent: {what} "
        "(not retried: the model may have processed it)"
    )


def _status_failure(status: int, headers: Mapping[str, str], text: str) -> ModelError:
    retry_after = headers.get("retry-after", "").strip()
    return ModelError(
        f"model endpoint answered HTTP {status}: {text[:500]}",
        status=status,
        retryable=status in RETRY_STATUSES,
        retry_after=min(int(retry_after), 2147483647) if retry_after.isdigit() else None,
    )


# -- the transport --------------------------------------------------------------------------


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Loading the trust store costs milliseconds: once per process, not once per client.
    return httpx.create_ssl_context()


def _proxy_configured() -> bool:
    return any(value and name.lower() in _PROXY_VARS for name, value in os.environ.items())


def engine_transport(limits: httpx.Limits = DEFAULT_LIMITS) -> httpx.AsyncBaseTransport | None:
    """The transport of the engine's own client, or None for httpx's default client (a proxy
    is configured: httpx honours HTTP_PROXY / HTTPS_PROXY / ALL_PROXY / NO_PROXY)."""
    if _proxy_configured():
        return None
    if os.environ.get(TRANSPORT_ENV, "").strip().lower() != "httpx":
        try:
            from httpx_aiohttp import AiohttpTransport
        except ImportError:
            pass
        else:
            return AiohttpTransport(verify=_ssl_context(), limits=limits)
    return httpx.AsyncHTTPTransport(verify=_ssl_context(), limits=limits)


# -- the model ------------------------------------------------------------------------------


class HTTPModel:
    """The model backend of `create_client`: POSTs each turn's body to `url`."""

    streams = True  # `stream` runs get the reply as server-sent events

    def __init__(
        self,
        *,
        dialect: Dialect,
        url: str,
        headers: Mapping[str, str] | None = None,
        retries: int = 2,
        retry_base_ms: float = 500,
        request_timeout: float | None = 120.0,
        http_client: httpx.AsyncClient | None = None,
        limits: httpx.Limits | None = None,
    ) -> None:
        self.dialect = dialect
        self.url = url
        self.headers = {"content-type": "application/json", **(headers or {})}
        self.retries = max(0, retries)
        self.retry_base = retry_base_ms / 1000
        self.limits = limits or DEFAULT_LIMITS
        self._timeout = httpx.Timeout(request_timeout)
        self._extensions = {"timeout": self._timeout.as_dict()}
        try:
            self._url: httpx.URL | str = httpx.URL(url)
        except httpx.InvalidURL:
            self._url = url  # fails on the first request, as a request to it would
        # The head of every request, normalised once (what httpx.Request would add per call);
        # `headers` are read here, at construction.
        host = [(b"Host", self._url.netloc)] if isinstance(self._url, httpx.URL) else []
        self._head = host + httpx.Headers(self.headers).raw
        self._http = http_client
        self._owns_http = http_client is None
        self._direct: httpx.AsyncBaseTransport | None = None  # our own client's transport
        self._loop: asyncio.AbstractEventLoop | None = None

    def http_client(self) -> httpx.AsyncClient:
        """The client the next request goes through (the engine's own: one per event loop)."""
        if self._owns_http:
            loop = asyncio.get_running_loop()
            if self._http is None or self._loop is not loop:
                transport = engine_transport(self.limits)
                self._http = httpx.AsyncClient(
                    timeout=self._timeout, limits=self.limits, transport=transport
                )
                self._direct, self._loop = transport, loop
        assert self._http is not None
        return self._http

    async def complete(self, body: dict[str, Any], emit: Emit | None) -> ModelTurn:
        """One model turn. `emit` set: the body asks for a stream, text deltas are emitted."""
        payload = _encode(body).encode()
        if emit is None:
            attempt: Callable[[], Awaitable[ModelTurn]] = lambda: self._post(payload)  # noqa: E731
        else:
            attempt = lambda: self._stream(payload, emit)  # noqa: E731
        if self.retries:
            return await with_retries(attempt, self.retries, self.retry_base)
        return await attempt()

    async def aclose(self) -> None:
        if self._http is not None and self._owns_http:
            http, self._http, self._direct = self._http, None, None
            await http.aclose()

    # -- one request ---------------------------------------------------------------------------

    async def _send(self, payload: bytes, *, stream: bool) -> httpx.Response:
        http = self.http_client()
        direct = self._direct if self._owns_http else None
        try:
            if direct is None:
                request = http.build_request(
                    "POST", self._url, content=payload, headers=self.headers
                )
                return await http.send(request, stream=stream)
            request = httpx.Request(
                "POST",
                self._url,
                headers=[*self._head, (b"Content-Length", b"%d" % len(payload))],
                stream=httpx.ByteStream(payload),
                extensions=self._extensions,
            )
            request.read()  # the body as bytes: sent with a Content-Length, never chunked
            response = await direct.handle_async_request(request)
            if not stream:
                try:
                    await response.aread()
                except BaseException:
                    await response.aclose()
                    raise
            return response
        except httpx.TransportError as exc:
            raise _transport_failure(exc) from exc
        except Exception as exc:
            if _is_aiohttp_error(exc):  # one httpx-aiohttp does not map
                raise _transport_failure(exc) from exc
            raise

    async def _post(self, payload: bytes) -> ModelTurn:
        response = await self._send(payload, stream=False)
        status = response.status_code
        if status >= 400:
            raise _status_failure(status, response.headers, response.text)
        return self._parse_whole(response.content, status)

    def _parse_whole(self, content: bytes, status: int) -> ModelTurn:
        try:
            data = json.loads(content)
        except ValueError as exc:
            raise ModelError(f"model reply is not valid JSON: {exc}", status=status) from exc
        if not isinstance(data, dict):
            raise ModelError("model reply is not a JSON object", status=status)
        return self.dialect.parse(data)

    async def _stream(self, payload: bytes, emit: Emit) -> ModelTurn:
        response = await self._send(payload, stream=True)
        assembler = self.dialect.new_stream_state()
        try:
            if response.status_code >= 400:
                text = (await response.aread()).decode(errors="replace")
                raise _status_failure(response.status_code, response.headers, text)
            if "json" in response.headers.get("content-type", ""):
                # An endpoint that does not stream answers the whole reply: its text at once.
                turn = self._parse_whole(await response.aread(), response.status_code)
                if turn.text:
                    emit({"type": "text", "delta": turn.text})
                return turn
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError as exc:
                    raise ModelError(f"model stream sent invalid JSON: {exc}") from exc
                if isinstance(chunk, dict):
                    piece = assembler.feed(chunk)
                    if piece:
                        emit({"type": "text", "delta": piece})
        except httpx.TransportError as exc:
            raise _transport_failure(exc) from exc
        except ModelError:
            raise
        except Exception as exc:
            if _is_aiohttp_error(exc):
                raise _transport_failure(exc) from exc
            raise
        finally:
            await response.aclose()
        return assembler.finish()
