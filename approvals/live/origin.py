"""Which pages may open a websocket: the same origin only (scheme, host AND port), as
Django's CSRF check compares an Origin header, plus CSRF_TRUSTED_ORIGINS. Channels'
AllowedHostsOriginValidator compares host names alone, so a page on another port of the same
host (http://localhost:3000) could open a reviewer's inbox socket with the reviewer's cookies.

The Host must be one Django would serve a page to (ALLOWED_HOSTS, with Django's own fallback
when DEBUG is on and ALLOWED_HOSTS is empty). A refused socket is logged at WARNING with the
reason: the browser only sees a failed connection.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

log = logging.getLogger(__name__)

_DEFAULT_PORTS = {"http": "80", "https": "443"}
# What Django's HttpRequest.get_host allows when DEBUG is on and ALLOWED_HOSTS is empty
# (startproject's settings): a page served there must be able to open its socket too.
DEBUG_FALLBACK_HOSTS = [".localhost", "127.0.0.1", "[::1]"]


def _netloc(scheme: str, netloc: str) -> str:
    """host:port with the scheme's default port made explicit."""
    domain, port = split_domain_port(netloc)
    return f"{domain}:{port or _DEFAULT_PORTS.get(scheme, '')}"


def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS as Django applies it to HTTP requests."""
    hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not hosts:
        return list(DEBUG_FALLBACK_HOSTS)
    return hosts


class SameOriginValidator:
    """ASGI middleware for websockets: the page that opens a socket must have this socket's
    origin (or a trusted one); anything else is denied before authentication runs."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator is for websocket connections")
        origin = host = ""
        for name, value in scope.get("headers", []):
            if name == b"origin":
                origin = value.decode("latin1").strip().lower()
            elif name == b"host":
                host = value.decode("latin1").strip().lower()
        reason = refusal(origin, host)
        if reason is None:
            return await self.application(scope, receive, send)
        log.warning(
            "live page socket %s refused (403): Origin %r, Host %r: %s",
            scope.get("path", ""),
            origin,
            host,
            reason,
        )
        return await WebsocketDenier()(scope, receive, send)


def refusal(origin: str, host: str) -> str | None:
    """Why a socket opened by a page of `origin` with this Host header is refused (None: it
    is not)."""
    parsed = urlsplit(origin)
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.netloc:
        return "the Origin is not an http(s) page" if origin else "no Origin header"
    if origin in (o.lower() for o in settings.CSRF_TRUSTED_ORIGINS):
        return None
    domain, _ = split_domain_port(host)
    if not domain:
        return "no valid Host header"
    hosts = allowed_hosts()
    if not validate_host(domain, hosts):
        if not settings.ALLOWED_HOSTS and settings.DEBUG:
            return (
                f"{domain!r} is not in ALLOWED_HOSTS (empty: with DEBUG on, Django allows "
                f"{', '.join(DEBUG_FALLBACK_HOSTS)} only)"
            )
        if not settings.ALLOWED_HOSTS:
            return "ALLOWED_HOSTS is empty and DEBUG is off, so no host is allowed"
        return f"{domain!r} is not in ALLOWED_HOSTS ({', '.join(hosts)})"
    # The page must name the host and port this socket was opened on. The scheme is not
    # compared: a TLS proxy may end https before the server sees a plain ws connection.
    if _netloc(parsed.scheme, parsed.netloc) != _netloc(parsed.scheme, host):
        return (
            "the page is not of the socket's origin (another host or port); a page of yours "
            "elsewhere goes in CSRF_TRUSTED_ORIGINS"
        )
    return None
