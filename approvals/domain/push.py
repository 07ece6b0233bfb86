"""Web Push's rules: when the server offers it (both VAPID keys set), what a browser's
subscription must look like before it is stored, and how a key pair is made.

A subscription is what `PushManager.subscribe()` gives a page: the push service's endpoint
(where the server POSTs) and the browser's keys (`p256dh`, its ECDH public key, and `auth`,
a shared secret) that encrypt each payload so that only that browser reads it."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from django.conf import settings
from py_vapid import Vapid

from ..conf import app_settings, is_loopback
from .exceptions import InvalidInput

MAX_ENDPOINT = 1000  # the model's field; push services' endpoints are a few hundred characters
MAX_BODY = 4096  # a subscription's JSON is well under 1 KB
P256DH_BYTES = 65  # an uncompressed P-256 point: 0x04, then x and y
AUTH_BYTES = 16
BASE64URL = re.compile(r"[A-Za-z0-9_-]+={0,2}")


def push_available() -> bool:
    """Push is offered (the page's button, the preference, the deliveries) only with both
    keys: one alone is a mistake that approvals.W004 names."""
    return bool(app_settings.VAPID_PUBLIC_KEY and app_settings.VAPID_PRIVATE_KEY)


def vapid_subject() -> str:
    """Who push services may contact about this server's pushes (a `mailto:` or `https:`)."""
    return app_settings.VAPID_SUBJECT or f"mailto:{settings.DEFAULT_FROM_EMAIL}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class VapidKeys:
    public_key: str  # the browser's applicationServerKey: base64url of the uncompressed point
    private_key: str  # base64url of the 32-byte private number (py_vapid reads it raw)


def make_vapid_keys() -> VapidKeys:
    """A fresh P-256 key pair, in the forms the settings take."""
    vapid = Vapid()
    vapid.generate_keys()
    number = vapid.private_key.private_numbers().private_value
    point = vapid.public_key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return VapidKeys(public_key=_b64url(point), private_key=_b64url(number.to_bytes(32, "big")))


@dataclass(frozen=True)
class Subscription:
    endpoint: str
    p256dh: str
    auth: str


def _key(keys: dict[str, Any], name: str, size: int) -> str:
    value = keys.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"keys.{name} is missing")
    if len(value) > 200:
        raise InvalidInput(f"keys.{name} is too long")
    try:
        # The decoder skips characters outside the alphabet: they are refused first.
        if not BASE64URL.fullmatch(value):
            raise ValueError(value)
        raw = _unb64url(value.rstrip("="))
    except (binascii.Error, ValueError):
        raise InvalidInput(f"keys.{name} is not base64url") from None
    if len(raw) != size:
        raise InvalidInput(f"keys.{name} must be {size} bytes, not {len(raw)}")
    return value


def parse_subscription(data: Any) -> Subscription:
    """The subscription a page sent (`PushSubscription.toJSON()`), or InvalidInput saying
    what is wrong. The endpoint must be https (browsers' push services are), or http on a
    loopback host (a test's stand-in service): never a plain-http address elsewhere."""
    if not isinstance(data, dict):
        raise InvalidInput("the body must be a JSON object with endpoint and keys")
    endpoint = data.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise InvalidInput("endpoint is missing")
    if len(endpoint) > MAX_ENDPOINT:
        raise InvalidInput(f"endpoint is longer than {MAX_ENDPOINT} characters")
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname or ""
    except ValueError:
        raise InvalidInput("endpoint is not a URL") from None
    if not host:
        raise InvalidInput("endpoint is not a URL")
    if parts.scheme != "https" and not (parts.scheme == "http" and is_loopback(host)):
        raise InvalidInput("endpoint must be an https URL")
    keys = data.get("keys")
    if not isinstance(keys, dict):
        raise InvalidInput("keys is missing (p256dh and auth)")
    p256dh = _key(keys, "p256dh", P256DH_BYTES)
    auth = _key(keys, "auth", AUTH_BYTES)
    if _unb64url(p256dh)[0] != 4:
        raise InvalidInput("keys.p256dh is not an uncompressed P-256 point")
    return Subscription(endpoint=endpoint, p256dh=p256dh, auth=auth)
