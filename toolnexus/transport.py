"""A lean HTTP/1.1 transport for `httpx.AsyncClient`, straight on asyncio.

Why it exists: per model round trip on loopback, httpx's default transport (httpcore + h11 +
anyio) costs about as much as everything else the engine does. This transport speaks only
what the engine needs, and speaks it correctly:

* HTTP/1.1 with a keep-alive pool per (scheme, host, port): LIFO idle list, a cap on idle
  connections, idle connections older than `idle_timeout` closed;
* TLS for https (SNI = host), with httpx's own default trust store unless a context is given;
* request bodies as bytes (head and body in one write) or as an async stream (chunked unless
  a Content-Length is given);
* response bodies framed by Content-Length, `Transfer-Encoding: chunked` (trailers read and
  kept on the stream) or connection close; streamed to the caller as they arrive;
* a stale keep-alive connection (closed by the server while idle) is replaced once, and only
  when not a single response byte arrived and the body can be sent again.

Not supported: proxies, HTTP/2, `Expect: 100-continue`, protocol upgrades. `default_transport()`
returns None when a proxy is configured, and the engine then keeps httpx's default transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from typing import Any

import httpx

__all__ = ["LeanTransport", "default_transport"]

_PROXY_VARS = frozenset({"http_proxy", "https_proxy", "all_proxy"})
_OPT_OUT_VAR = "TOOLNEXUS_HTTP_TRANSPORT"  # set to "httpx" to keep httpx's default transport
_DEFAULT_PORTS = {"http": 80, "https": 443}
_MAX_HEAD = 256 * 1024  # status line + headers of one response, and its trailers
_MAX_LINE = 8 * 1024  # one chunk-size line
_READ_HIGH_WATER = 1024 * 1024  # stop reading the socket while this much sits unread
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_HEX = b"0123456789abcdefABCDEF"

Timeouts = dict[str, float | None]


def default_transport() -> LeanTransport | None:
    """The transport the engine's own http client uses, or None to keep httpx's default.

    None when a proxy is configured (HTTP_PROXY / HTTPS_PROXY / ALL_PROXY, any case): this
    transport talks to the origin only, and httpx already honours those variables.
    """
    if os.environ.get(_OPT_OUT_VAR, "").strip().lower() == "httpx":
        return None
    for name, value in os.environ.items():
        if value and name.lower() in _PROXY_VARS:
            return None
    return LeanTransport()


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over asyncio streams, pooled per (scheme, host, port).

    Concurrent requests never share a connection: each takes an idle one or opens its own.
    There is no cap on open connections, so the `pool` timeout never applies.
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_idle_per_host: int = 20,
        idle_timeout: float = 30.0,
    ) -> None:
        self._ssl_context = ssl_context
        self._max_idle = max_idle_per_host
        self._idle_timeout = idle_timeout
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}  # oldest first
        self._conns: set[_Conn] = set()  # every open connection, idle or busy

    # -- httpx API ---------------------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}", request=request)
        if not url.host:
            raise httpx.UnsupportedProtocol("request URL has no host", request=request)
        key = (scheme, url.host, url.port or _DEFAULT_PORTS[scheme])
        timeouts: Timeouts = request.extensions.get("timeout") or {}
        try:
            body: bytes | None = request.content
        except httpx.RequestNotRead:
            body = None  # a stream: sent once, never replayed
        head, chunked, keep_alive = _request_head(request, body)
        loop = asyncio.get_running_loop()
        conn = self._checkout(key, loop)
        if conn is None:
            conn = await self._connect(key, request, timeouts, loop)
        try:
            return await self._exchange(conn, request, head, body, chunked, keep_alive, timeouts)
        except _Stale as stale:
            if not stale.replayable:
                raise stale.error from stale.error.__cause__
        # The idle connection had been closed by the server: one fresh try, which never
        # raises _Stale (a new connection is not reused).
        conn = await self._connect(key, request, timeouts, loop)
        return await self._exchange(conn, request, head, body, chunked, keep_alive, timeouts)

    async def aclose(self) -> None:
        self._idle.clear()
        conns = list(self._conns)
        self._conns.clear()
        for conn in conns:
            conn.close()
        if conns:
            await asyncio.sleep(0)  # let the loop run connection_lost: sockets released now

    # -- pool --------------------------------------------------------------------------------

    def _checkout(self, key: tuple[str, str, int], loop: asyncio.AbstractEventLoop) -> _Conn | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        self._expire(idle, time.monotonic())
        while idle:
            conn = idle.pop()  # newest first: the least likely to have been timed out
            # EOF: the server closed it. Bytes while idle: the server broke the protocol.
            # Another loop: it belongs to a client of an event loop that is gone.
            if conn.eof or conn.buf or conn.loop is not loop:
                conn.abort()
                continue
            return conn
        return None

    def _release(self, conn: _Conn) -> None:
        """Back to the idle list after a complete response, or closed."""
        if conn.eof or conn.buf or self._max_idle <= 0:
            conn.abort()
            return
        conn.resume_reading()  # an idle connection must still notice the server's EOF
        idle = self._idle.setdefault(conn.key, [])
        conn.idle_since = now = time.monotonic()
        self._expire(idle, now)
        if len(idle) >= self._max_idle:
            idle.pop(0).close()
        idle.append(conn)

    def _expire(self, idle: list[_Conn], now: float) -> None:
        while idle and now - idle[0].idle_since > self._idle_timeout:
            idle.pop(0).close()

    def _finish(self, conn: _Conn, reusable: bool) -> None:
        if reusable:
            self._release(conn)
        else:
            conn.close()

    async def _connect(
        self,
        key: tuple[str, str, int],
        request: httpx.Request,
        timeouts: Timeouts,
        loop: asyncio.AbstractEventLoop,
    ) -> _Conn:
        scheme, host, port = key
        tls: ssl.SSLContext | None = None
        sni: str | None = None
        if scheme == "https":
            tls = self._tls()
            sni = request.extensions.get("sni_hostname") or host
        conn = _Conn(loop, key, self._conns)
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                await loop.create_connection(lambda: conn, host, port, ssl=tls, server_hostname=sni)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(
                f"connecting to {host}:{port} timed out", request=request
            ) from exc
        except OSError as exc:  # refused, unreachable, DNS, TLS (ssl.SSLError is an OSError)
            raise httpx.ConnectError(f"{host}:{port}: {exc}", request=request) from exc
        self._conns.add(conn)
        return conn

    def _tls(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            # ssl.create_default_context() with httpx's trust store (certifi, or
            # SSL_CERT_FILE / SSL_CERT_DIR), so switching transports verifies the same servers.
            self._ssl_context = httpx.create_ssl_context()
            self._ssl_context.set_alpn_protocols(["http/1.1"])
        return self._ssl_context

    # -- one request/response ----------------------------------------------------------------

    async def _exchange(
        self,
        conn: _Conn,
        request: httpx.Request,
        head: bytes,
        body: bytes | None,
        chunked: bool,
        keep_alive: bool,
        timeouts: Timeouts,
    ) -> httpx.Response:
        reused = conn.requests > 0
        conn.requests += 1
        conn.got_bytes = False
        streamed = False
        read_timeout = timeouts.get("read")
        try:
            if conn.eof:
                raise _lost(conn, request)
            if body is not None:
                if chunked:  # the caller asked for chunked framing of a bytes body
                    body = (b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)) if body else b"0\r\n\r\n"
                # One write: head and body in separate segments would meet Nagle's
                # algorithm and delayed ACK on the server side (~40 ms per request).
                conn.transport.write(head + body)
            else:
                conn.transport.write(head)
                streamed = True
                await _write_stream(conn, request, chunked, timeouts.get("write"))
            await _drain(conn, request, timeouts.get("write"))
            while True:
                status, reason, version, headers = _parse_head(
                    await _read_head(conn, request, read_timeout)
                )
                if not 100 <= status < 200 or status == 101:
                    break  # 1xx interim responses (100, 103) come before the real one
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
            conn.abort()
            if reused and not conn.got_bytes:
                raise _Stale(exc, replayable=not streamed) from exc
            raise
        except BaseException:
            conn.abort()  # timeout, cancellation, a failing body stream: state unknown
            raise

        try:
            decoder, reusable = _body_decoder(request.method, status, version, headers)
        except httpx.RemoteProtocolError:
            conn.abort()
            raise
        reusable = reusable and keep_alive
        extensions: dict[str, Any] = {"http_version": version, "reason_phrase": reason}
        if decoder is None:
            self._finish(conn, reusable and status != 101)
            stream: httpx.AsyncByteStream = httpx.ByteStream(b"")
        elif isinstance(decoder, _Fixed) and len(conn.buf) >= decoder.remaining:
            # Fast path: the whole body came with the head; the connection is free already.
            data = decoder.take(conn)
            self._finish(conn, reusable)
            stream = httpx.ByteStream(data)
        else:
            stream = _Body(self, conn, decoder, reusable, read_timeout, request)
        return httpx.Response(
            status, headers=headers, stream=stream, extensions=extensions, request=request
        )


# -- connection ------------------------------------------------------------------------------


class _Conn(asyncio.Protocol):
    """One connection: the event loop appends to `buf`, one request at a time consumes it."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, key: tuple[str, str, int], owner: set[_Conn]
    ) -> None:
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.buf = bytearray()
        self.eof = False  # no more bytes will come (peer EOF, lost, or closed by us)
        self.error: BaseException | None = None  # why the connection was lost, if not EOF
        self.got_bytes = False  # a byte arrived since the current request started
        self.requests = 0
        self.idle_since = 0.0
        self._owner = owner
        self._waiter: asyncio.Future[bool] | None = None
        self._drainer: asyncio.Future[bool] | None = None
        self._write_paused = False
        self._read_paused = False

    # protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.got_bytes = True
        if len(self.buf) > _READ_HIGH_WATER and not self._read_paused:
            self._read_paused = True  # back-pressure: a slow consumer must not buffer it all
            self.transport.pause_reading()
        _wake(self._waiter, True)

    def eof_received(self) -> bool | None:
        self.eof = True
        _wake(self._waiter, True)
        return None  # close: HTTP/1.1 has no use for a half-closed connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None:
            self.error = exc
        self._owner.discard(self)
        _wake(self._waiter, True)
        _wake(self._drainer, True)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        _wake(self._drainer, True)

    # used by the transport

    async def wait_data(self, timeout: float | None) -> bool:
        """Wait for more bytes or EOF; False if `timeout` seconds passed first."""
        if self.eof:
            return True
        self.resume_reading()
        self._waiter = fut = self.loop.create_future()
        return await self._wait(fut, timeout)

    def resume_reading(self) -> None:
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()

    async def drain(self, timeout: float | None) -> bool:
        """Wait until the transport takes more writes; False on timeout."""
        while self._write_paused and not self.eof:
            self._drainer = fut = self.loop.create_future()
            if not await self._wait(fut, timeout):
                return False
        return True

    async def _wait(self, fut: asyncio.Future[bool], timeout: float | None) -> bool:
        # A timer on the future is cheaper than asyncio.wait_for / asyncio.timeout, and
        # this runs for every response.
        timer = self.loop.call_later(timeout, _wake, fut, False) if timeout is not None else None
        try:
            return await fut
        finally:
            self._waiter = self._drainer = None
            if timer is not None:
                timer.cancel()

    def close(self) -> None:
        self.eof = True
        self._owner.discard(self)
        if self.transport is not None:
            with contextlib.suppress(RuntimeError):  # its event loop is already closed
                self.transport.close()

    def abort(self) -> None:
        self.eof = True
        self._owner.discard(self)
        if self.transport is not None:
            with contextlib.suppress(RuntimeError):
                self.transport.abort()


def _wake(fut: asyncio.Future[bool] | None, value: bool) -> None:
    if fut is not None and not fut.done():
        fut.set_result(value)


class _Stale(Exception):
    """A reused connection failed before any response byte: the server had closed it."""

    def __init__(self, error: httpx.TransportError, replayable: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.replayable = replayable


def _lost(conn: _Conn, request: httpx.Request) -> httpx.TransportError:
    if conn.error is not None:
        return httpx.ReadError(f"connection lost: {conn.error!r}", request=request)
    if not conn.got_bytes:
        return httpx.RemoteProtocolError(
            "Server disconnected without sending a response.", request=request
        )
    return httpx.RemoteProtocolError("server closed the connection mid-response", request=request)


# -- request ---------------------------------------------------------------------------------


def _request_head(request: httpx.Request, body: bytes | None) -> tuple[bytes, bool, bool]:
    """(request line + headers, body chunked?, connection may be kept?)."""
    lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), request.url.raw_path)]
    has_host = has_length = chunked = False
    keep_alive = True
    for name, value in request.headers.raw:
        lname = name.lower()
        if lname == b"host":
            has_host = True
        elif lname == b"content-length":
            has_length = True
        elif lname == b"transfer-encoding":
            chunked = value.strip().lower().endswith(b"chunked")
        elif lname == b"connection":
            keep_alive = b"close" not in value.lower()
        lines.append(b"%s: %s" % (name, value))
    if not has_host:
        lines.insert(1, b"Host: " + request.url.netloc)
    if not has_length and not chunked:
        if body is None:
            lines.append(b"Transfer-Encoding: chunked")  # a stream of unknown length
            chunked = True
        elif body or request.method in _BODY_METHODS:
            lines.append(b"Content-Length: %d" % len(body))
    head = b"\r\n".join(lines)
    # A CR or LF inside a header would let a value smuggle extra headers or requests.
    if head.count(b"\n") != len(lines) - 1 or head.count(b"\r") != len(lines) - 1:
        raise httpx.LocalProtocolError("CR or LF in a request header", request=request)
    return head + b"\r\n\r\n", chunked, keep_alive


async def _write_stream(
    conn: _Conn, request: httpx.Request, chunked: bool, timeout: float | None
) -> None:
    write = conn.transport.write
    async for chunk in request.stream:  # type: ignore[union-attr]
        if conn.eof:
            raise _lost(conn, request)
        if chunk:
            write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            await _drain(conn, request, timeout)
    if chunked:
        write(b"0\r\n\r\n")


async def _drain(conn: _Conn, request: httpx.Request, timeout: float | None) -> None:
    if not await conn.drain(timeout):
        raise httpx.WriteTimeout("timed out sending the request", request=request)
    if conn.error is not None:
        raise httpx.WriteError(f"connection lost: {conn.error!r}", request=request)


# -- response head ---------------------------------------------------------------------------


async def _read_head(conn: _Conn, request: httpx.Request, timeout: float | None) -> bytes:
    buf = conn.buf
    start = 0
    while True:
        end = buf.find(b"\r\n\r\n", start)
        if end >= 0:
            head = bytes(buf[:end])
            del buf[: end + 4]
            return head
        if len(buf) > _MAX_HEAD:
            raise httpx.RemoteProtocolError("response head too large", request=request)
        if conn.eof:
            raise _lost(conn, request)
        start = max(0, len(buf) - 3)
        if not await conn.wait_data(timeout):
            raise httpx.ReadTimeout("timed out waiting for the response", request=request)


def _parse_head(head: bytes) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:100]!r}")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):  # obsolete line folding: continues the previous value
            if not headers:
                raise httpx.RemoteProtocolError("malformed response head: leading fold")
            name, value = headers[-1]
            headers[-1] = (name, value + b" " + line.strip())
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name.strip() != name:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:100]!r}")
        headers.append((name, value.strip(b" \t")))
    return int(code), reason, version, headers


def _body_decoder(
    method: str, status: int, version: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[_Fixed | _Chunked | _UntilClose | None, bool]:
    """How the body is framed (RFC 9112 §6.3), and whether the connection can be reused."""
    lengths: set[bytes] = set()
    coding: bytes | None = None
    tokens: set[bytes] = set()
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-length":
            lengths.update(v.strip() for v in value.split(b","))
        elif lname == b"transfer-encoding":
            coding = value.lower().rsplit(b",", 1)[-1].strip()
        elif lname == b"connection":
            tokens.update(t.strip() for t in value.lower().split(b","))
    reusable = b"close" not in tokens and (version == b"HTTP/1.1" or b"keep-alive" in tokens)
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return None, reusable
    if coding is not None:
        if lengths:  # both: a smuggling pattern; trust chunked, never reuse (RFC 9112 §6.1)
            reusable = False
        if coding == b"chunked":
            return _Chunked(), reusable
        return _UntilClose(), False
    if lengths:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise httpx.RemoteProtocolError(f"invalid Content-Length {sorted(lengths)!r}")
        length = int(next(iter(lengths)))
        return (_Fixed(length) if length else None), reusable
    return _UntilClose(), False


# -- response body ---------------------------------------------------------------------------


class _Fixed:
    """A Content-Length body."""

    __slots__ = ("done", "remaining")

    def __init__(self, length: int) -> None:
        self.remaining = length
        self.done = length == 0

    def take(self, conn: _Conn) -> bytes:
        buf = conn.buf
        n = min(self.remaining, len(buf))
        if n == len(buf):
            data = bytes(buf)
            buf.clear()
        else:
            data = bytes(buf[:n])
            del buf[:n]
        self.remaining -= n
        self.done = self.remaining == 0
        return data


class _UntilClose:
    """No framing: the body ends when the server closes the connection."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def take(self, conn: _Conn) -> bytes:
        data = bytes(conn.buf)
        conn.buf.clear()
        if conn.eof:
            if conn.error is not None:  # a reset is not an end of body
                raise httpx.ReadError(f"connection lost: {conn.error!r}")
            self.done = True
        return data


class _Chunked:
    """`Transfer-Encoding: chunked`: size lines, data, then trailers up to an empty line."""

    __slots__ = ("done", "remaining", "state", "trailer_bytes", "trailers")
    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self) -> None:
        self.state = self._SIZE
        self.remaining = 0
        self.done = False
        self.trailers: list[tuple[bytes, bytes]] = []
        self.trailer_bytes = 0

    def take(self, conn: _Conn) -> bytes:
        """Decode what the buffer holds; stops at the end of the body or of the bytes."""
        buf = conn.buf
        out: list[bytes | bytearray] = []
        pos = 0
        while not self.done:
            if self.state == self._DATA:
                n = min(self.remaining, len(buf) - pos)
                if not n:
                    break
                out.append(buf[pos : pos + n])
                pos += n
                self.remaining -= n
                if not self.remaining:
                    self.state = self._DATA_END
            elif self.state == self._DATA_END:
                if len(buf) - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise httpx.RemoteProtocolError("malformed chunked body: no CRLF after data")
                pos += 2
                self.state = self._SIZE
            else:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if len(buf) - pos > _MAX_LINE:
                        raise httpx.RemoteProtocolError("malformed chunked body: line too long")
                    break
                line = bytes(buf[pos:end])
                pos = end + 2
                if self.state == self._SIZE:
                    self._size_line(line)
                else:
                    self._trailer_line(line)
        del buf[:pos]
        return b"".join(out)

    def _size_line(self, line: bytes) -> None:
        size = line.split(b";", 1)[0].strip()  # drop chunk extensions
        if not size or size.strip(_HEX):
            raise httpx.RemoteProtocolError(f"malformed chunk size {line[:40]!r}")
        self.remaining = int(size, 16)
        self.state = self._DATA if self.remaining else self._TRAILER

    def _trailer_line(self, line: bytes) -> None:
        if not line:
            self.done = True
            return
        self.trailer_bytes += len(line)
        name, sep, value = line.partition(b":")
        if not sep or not name or self.trailer_bytes > _MAX_HEAD:
            raise httpx.RemoteProtocolError(f"malformed trailer {line[:100]!r}")
        self.trailers.append((name, value.strip(b" \t")))


class _Body(httpx.AsyncByteStream):
    """A response body read from the connection as it arrives.

    The connection goes back to the pool once the body was read to its end; a body closed
    early closes the connection (unless the rest had already arrived).
    """

    def __init__(
        self,
        pool: LeanTransport,
        conn: _Conn,
        decoder: _Fixed | _Chunked | _UntilClose,
        reusable: bool,
        timeout: float | None,
        request: httpx.Request,
    ) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn  # None once released or closed
        self._decoder = decoder
        self._reusable = reusable
        self._timeout = timeout
        self._request = request

    @property
    def trailers(self) -> list[tuple[bytes, bytes]]:
        return self._decoder.trailers if isinstance(self._decoder, _Chunked) else []

    def __aiter__(self) -> _Body:  # type: ignore[override]  # an iterator, not a generator
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            raise StopAsyncIteration
        try:
            data = await self._next(conn)
        except BaseException:
            self._drop()
            raise
        if not data:
            raise StopAsyncIteration
        return data

    async def _next(self, conn: _Conn) -> bytes:
        """The next piece of the body; b"" at its end (connection already settled)."""
        decoder = self._decoder
        while True:
            data = decoder.take(conn)
            if decoder.done:
                self._settle()  # before the last piece: a caller that stops there keeps it
                return data
            if data:
                return data
            if conn.eof:
                if conn.error is not None:
                    raise httpx.ReadError(f"connection lost: {conn.error!r}", request=self._request)
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body",
                    request=self._request,
                )
            if not await conn.wait_data(self._timeout):
                raise httpx.ReadTimeout("timed out reading the response", request=self._request)

    async def aclose(self) -> None:
        conn = self._conn
        if conn is None:
            return
        # Stopped early (e.g. at an SSE "[DONE]"): if the rest is already buffered, finish
        # it here and keep the connection, rather than paying a new one next request.
        with contextlib.suppress(httpx.HTTPError):
            self._decoder.take(conn)
        if self._decoder.done:
            self._settle()
        else:
            self._drop()

    def _settle(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._finish(conn, self._reusable)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()
