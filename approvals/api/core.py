"""The API object: authentication (bearer tokens, the browser's session), throttles, the
strict JSON parser, and the mapping of errors to JSON answers."""

from __future__ import annotations

import logging
import math
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, Throttled, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer, SessionAuth
from ninja.throttling import SimpleRateThrottle

from .. import permissions, services
from ..conf import app_settings
from ..domain.exceptions import ServiceError
from ..domain.jsonvalues import strict_json_loads
from ..telemetry import logs
from ..telemetry.middleware import username_of

# -- throttles -----------------------------------------------------------------------------


class SettingRateThrottle(SimpleRateThrottle):
    """django-ninja's cache-backed throttle, its rate read from a setting on every request
    (so a deployment, or a test, changes it without re-creating the API); an empty rate
    turns it off. Client addresses come from `permissions.client_ip` (proxy-aware only for
    TOOLNEXUS_TRUSTED_PROXIES; a client cannot pick its own through X-Forwarded-For)."""

    setting = ""  # the name in approvals.conf (TOOLNEXUS_ + this in settings)

    def __init__(self) -> None:  # the rate is read per request, not once
        self.rate = None

    def _configure(self) -> bool:
        self.rate = (getattr(app_settings, self.setting) if self.setting else "") or None
        if self.rate is None:
            return False
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return True

    def allow_request(self, request: HttpRequest) -> bool:
        if not self._configure():
            return True
        return super().allow_request(request)

    def get_ident(self, request: HttpRequest) -> str:
        return permissions.client_ip(request) or "unknown"


class TokenRateThrottle(SettingRateThrottle):
    """Requests per bearer token (TOOLNEXUS_API_TOKEN_RATE); sessions are not counted here."""

    scope = "token"
    setting = "API_TOKEN_RATE"

    def get_cache_key(self, request: HttpRequest) -> str | None:
        token = getattr(request, "api_token", None)
        if token is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": token.key_hash[:32]}


class UserRateThrottle(SettingRateThrottle):
    """Requests per user, every token and the browser session together
    (TOOLNEXUS_API_USER_RATE)."""

    scope = "user"
    setting = "API_USER_RATE"

    def get_cache_key(self, request: HttpRequest) -> str | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": user.pk}


class AuthFailureThrottle(SettingRateThrottle):
    """Failed bearer authentications per client address (TOOLNEXUS_API_AUTH_FAILURE_RATE):
    only failures count; once over the rate every bearer attempt from that address is 429
    until the oldest failure ages out, a right token too (else the answer would tell a guess
    that hit)."""

    scope = "bearer_failure"
    setting = "API_AUTH_FAILURE_RATE"

    def get_cache_key(self, request: HttpRequest) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def blocked_for(self, request: HttpRequest) -> float | None:
        """Seconds until this address may try again, or None if it may now."""
        if not self._configure():
            return None
        history = self._history(request)
        if len(history) < self.num_requests:
            return None
        return max(0.0, self.duration - (self.timer() - history[-1]))

    def note_failure(self, request: HttpRequest) -> None:
        if not self._configure():
            return
        history = [self.timer(), *self._history(request)][: self.num_requests]
        self.cache.set(self.get_cache_key(request), history, self.duration)

    def _history(self, request: HttpRequest) -> list[float]:
        now = self.timer()
        return [
            t for t in self.cache.get(self.get_cache_key(request), []) if t > now - self.duration
        ]


class TooManyFailures(Throttled):
    detail = "too many failed authentications from your address"


AUTH_FAILURES = AuthFailureThrottle()


class BearerToken(HttpBearer):
    """`Authorization: Bearer <token>`. A token that does not authenticate is 401 saying
    why (unknown, expired, revoked, its account inactive), never a fall-back to the
    session; an address with too many such failures is 429 for a while."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        wait = AUTH_FAILURES.blocked_for(request)
        if wait is not None:
            raise TooManyFailures(wait=wait)
        try:
            row = services.api_token_verify(token)
        except services.TokenRejected:
            AUTH_FAILURES.note_failure(request)
            raise
        request.user = row.user
        request.api_token = row
        logs.bind(user=username_of(row.user), user_id=row.user.pk)  # the middleware saw no user yet
        return row.user


class BrowserSession(SessionAuth):
    """The browser's session; CSRF is checked only once we know who is asking, so an
    anonymous caller gets 401 (authenticate first), not a confusing CSRF 403."""

    def _get_key(self, request: HttpRequest) -> str | None:
        if not request.user.is_authenticated:
            return None
        return super()._get_key(request)


class StrictJSONParser(Parser):
    def parse_body(self, request: HttpRequest):
        return strict_json_loads(request.body)


log = logging.getLogger("approvals.api")  # one logger for the API, whichever module


class ToolnexusAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation) -> str:
        # The ids the schema had when the API was one module (approvals_api_<view>): a client
        # generated from it keeps its method names.
        module = operation.view_func.__module__
        if module.startswith(f"{__package__}."):
            module = __package__
        return (module + "_" + operation.view_func.__name__).replace(".", "_")


api = ToolnexusAPI(
    title="toolnexus-web API",
    parser=StrictJSONParser(),
    version="1",
    description=(
        "Start agent runs, and answer or decline the requests they halt on.\n\n"
        "Authenticate with the browser session (CSRF-protected) or `Authorization: Bearer"
        " <token>` (`manage.py api_token <username>`; tokens expire, see `expires_at`, and"
        " can be listed and revoked under `/api/tokens`). A token that does not authenticate"
        " is 401 with a `detail` saying why (not valid, expired, revoked). Requests are"
        " throttled per token, per user and, for failed bearer authentication, per client"
        " address, and starting runs per user per minute: over a limit the answer is 429"
        " with a `Retry-After` header (seconds). Runs and requests of agents your groups may"
        " not see are left out of lists and are 404.\n\n"
        "## Host events\n\n"
        "Hear what happens either by listening to `GET /api/events` (server-sent events,"
        " resumable with `Last-Event-ID`) or through webhooks (the admin's \"Webhook"
        ' subscriptions"). Each webhook is a JSON POST signed per the Standard Webhooks'
        " specification: headers `webhook-id` (the event's id, the same on every attempt:"
        " drop repeats by it), `webhook-timestamp` (Unix seconds) and `webhook-signature`"
        " (`v1,<base64 HMAC-SHA256>` of `<webhook-id>.<webhook-timestamp>.<body>`, keyed with"
        " the subscription's secret, base64-decoded after its `whsec_` prefix). Verify the"
        " raw body before parsing it, with any Standard Webhooks library, for example in"
        " Python:\n\n"
        "```python\n"
        "from standardwebhooks.webhooks import Webhook\n\n"
        "event = Webhook(SECRET).verify(raw_body, headers)  # raises if forged or stale\n"
        "```\n\n"
        "Refuse a timestamp more than five minutes from your clock. Delivery is at least"
        " once; a receiver that does not answer 2xx in time is retried with backoff."
    ),
    auth=[BearerToken(), BrowserSession()],
    throttle=[TokenRateThrottle(), UserRateThrottle()],
    # Nested in the app's namespace: never "api", which a host project may use itself.
    urls_namespace="approvals:toolnexus_api",
)


# -- error mapping -------------------------------------------------------------------------


def _field_path(loc: Any) -> str:
    parts = [str(p) for p in loc if p not in ("body", "payload", "query", "filters")]
    return ".".join(parts) or "body"


@api.exception_handler(ValidationError)
def _validation_error(request, exc: ValidationError):
    first = exc.errors[0] if exc.errors else {}
    where = _field_path(first.get("loc", ()))
    message = first.get("msg", "invalid input")
    if first.get("type") == "extra_forbidden":
        message = "is not an accepted field"
    more = f" (and {len(exc.errors) - 1} more problem(s))" if len(exc.errors) > 1 else ""
    return api.create_response(request, {"detail": f"{where}: {message}{more}"}, status=400)


@api.exception_handler(ServiceError)
def _service_error(request, exc: ServiceError):
    response = api.create_response(request, {"detail": str(exc)}, status=exc.status)
    if getattr(exc, "retry_after", None):
        response["Retry-After"] = str(exc.retry_after)
    if exc.status == 401:
        response["WWW-Authenticate"] = 'Bearer error="invalid_token"'
    return response


@api.exception_handler(Throttled)
def _throttled(request, exc: Throttled):
    wait = max(1, math.ceil(exc.wait)) if exc.wait is not None else 60
    what = getattr(exc, "detail", "too many requests")
    response = api.create_response(
        request, {"detail": f"{what}: try again in {wait} s"}, status=429
    )
    response["Retry-After"] = str(wait)
    return response


@api.exception_handler(ObjectDoesNotExist)
def _not_found(request, exc):
    return api.create_response(request, {"detail": "not found"}, status=404)


@api.exception_handler(DatabaseError)
def _database_unavailable(request, exc):
    # Nothing was half-written: the transaction rolled back, so the caller may retry.
    log.exception("database error on %s", request.path)
    detail = "the database is unavailable right now; nothing was changed, try again"
    return api.create_response(request, {"detail": detail}, status=503)


@api.exception_handler(RequestDataTooBig)
def _too_big(request, exc):
    return api.create_response(request, {"detail": "request body too large"}, status=413)


@api.exception_handler(Exception)
def _server_error(request, exc: Exception):
    # With DEBUG on, Django's debug page shows the traceback; otherwise clients get JSON
    # (whatever the host project's handler500 renders) and the log gets the traceback.
    if settings.DEBUG:
        raise exc
    log.error("server error on %s", request.path, exc_info=exc)
    return api.create_response(request, {"detail": "Internal server error"}, status=500)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return api.create_response(
        request,
        {"detail": "authentication required: a session or an Authorization: Bearer token"},
        status=401,
    )


def require_view(request: HttpRequest, permission: str) -> frozenset[str]:
    """The global view permission, then the agents this caller may not see."""
    if not request.user.has_perm(permission):
        raise services.NotAllowed("you do not have permission to view this")
    return permissions.hidden_agents(request.user)
