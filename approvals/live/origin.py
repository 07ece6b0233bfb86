"""Which pages may open a websocket: the same origin only (scheme, host AND port), as
Django's CSRF check compares an Origin header, plus CSRF_TRUSTED_ORIGINS. Channels'
AllowedHostsOriginValidator compares host names alone, so a page on another port of the same
host (http://localhost:3000) could open a reviewer's inbox socket with the reviewer's cookies.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

_DEFAULT_PORTS = {"http": "80", "https": "443"}


def _netloc(scheme: str, netloc: str) -> str:
    """host:port with the scheme's default port made explicit."""
    domain, port = split_domain_port(netloc)
    return f"{domain}:{port or _DEFAULT_PORTS.get(scheme, '')}"


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
        if same_origin(origin, host):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)


def same_origin(origin: str, host: str) -> bool:
    parsed = urlsplit(origin)
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.netloc:
        return False
    if origin in (o.lower() for o in settings.CSRF_TRUSTED_ORIGINS):
        return True
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    # The page must name the host and port this socket was opened on. The scheme is not
    # compared: a TLS proxy may end https before the server sees a plain ws connection.
    return _netloc(parsed.scheme, parsed.netloc) == _netloc(parsed.scheme, host)
