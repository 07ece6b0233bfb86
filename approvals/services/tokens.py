"""API tokens: only a hash is stored; the token is shown once.

A token works until it expires or is revoked: by its owner (the API), by an operator (the
`revoke_api_token` command, the admin action), or by a change of its owner's password.
`last_used_at` is written at most once a minute per token, not once per request.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth.hashers import check_password
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..conf import app_settings
from ..domain.exceptions import InvalidInput, ServiceError
from ..models import ApiToken

LAST_USED_EVERY = timedelta(minutes=1)
MAX_TOKEN_DAYS = 3650


class TokenRejected(ServiceError):
    """A bearer token that does not authenticate (401); the message says why."""

    status = 401


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def api_token_create(*, user: Any, name: str = "", days: int | None = None) -> tuple[str, ApiToken]:
    """A new token for `user`, valid for `days` (None: TOOLNEXUS_TOKEN_DAYS; 0: no expiry)."""
    if days is None:
        days = int(app_settings.TOKEN_DAYS or 0)
    if not isinstance(days, int) or isinstance(days, bool) or not 0 <= days <= MAX_TOKEN_DAYS:
        raise InvalidInput(
            f"days: must be a whole number from 0 (never expires) to {MAX_TOKEN_DAYS}"
        )
    token = ApiToken.generate()
    row = ApiToken.objects.create(
        user=user,
        name=name[:100],
        prefix=token[:12],
        key_hash=ApiToken.hash(token),
        expires_at=timezone.now() + timedelta(days=days) if days else None,
    )
    return token, row


def api_token_verify(token: str) -> ApiToken:
    """The token's row (its user loaded) if it authenticates now; else TokenRejected saying
    why: unknown, expired, revoked, or its user deactivated. Every message starts with
    "authentication failed" so a client can tell a credential problem at a glance."""
    if not token or len(token) > 200:
        raise TokenRejected("authentication failed: this bearer token is not valid")
    try:
        row = ApiToken.objects.select_related("user").get(key_hash=ApiToken.hash(token))
    except ApiToken.DoesNotExist:
        raise TokenRejected("authentication failed: this bearer token is not valid") from None
    now = timezone.now()
    if row.revoked_at is not None:
        why = f" ({row.revoked_reason})" if row.revoked_reason else ""
        raise TokenRejected(
            f"authentication failed: API token {row.prefix}… was revoked at"
            f" {_iso(row.revoked_at)}{why}; create a new one"
        )
    if row.expires_at is not None and row.expires_at <= now:
        raise TokenRejected(
            f"authentication failed: API token {row.prefix}… expired at {_iso(row.expires_at)};"
            " create a new one"
        )
    if not row.user.is_active:
        raise TokenRejected("authentication failed: the account of this API token is inactive")
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY:
        # At most one write a minute per token: the UPDATE's own condition keeps concurrent
        # requests from writing it again.
        stale = Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - LAST_USED_EVERY)
        ApiToken.objects.filter(stale, pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row


def api_token_authenticate(token: str) -> Any:
    """The active user a bearer token belongs to, or None."""
    try:
        return api_token_verify(token).user
    except TokenRejected:
        return None


def api_token_revoke(*, token_id: int, user: Any, reason: str = "revoked by its owner") -> ApiToken:
    """Revoke one of `user`'s own tokens (another user's token does not exist for them:
    404). Revoking a revoked token changes nothing."""
    with transaction.atomic():
        row = ApiToken.objects.select_for_update().get(pk=token_id, user=user)
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.revoked_reason = reason[:200]
            row.save(update_fields=["revoked_at", "revoked_reason"])
    return row


def api_tokens_revoke(*, tokens: Any, reason: str) -> int:
    """Revoke every still-active token of a queryset (the admin action, the command);
    returns how many were revoked."""
    return tokens.filter(revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_reason=reason[:200]
    )


# -- a changed password revokes the user's tokens ------------------------------------------
# Connected in apps.py to the user model's pre_save and post_save. Signing in saves only
# last_login (no check at all); a hash upgraded to new hasher settings keeps the password,
# so it keeps the tokens too.

_PASSWORD_CHANGED = "_toolnexus_password_changed"


def note_password_change(sender, instance, update_fields=None, raw=False, **kwargs) -> None:
    if raw or instance.pk is None:
        return
    if update_fields is not None and "password" not in update_fields:
        return
    old = sender._default_manager.filter(pk=instance.pk).values_list("password", flat=True).first()
    if old is None or old == instance.password:
        return
    typed = getattr(instance, "_password", None)  # set by set_password() until saved
    if typed is not None and check_password(typed, old):
        return  # the same password, hashed again
    setattr(instance, _PASSWORD_CHANGED, True)


def revoke_tokens_after_password_change(sender, instance, created=False, **kwargs) -> None:
    if created or not getattr(instance, _PASSWORD_CHANGED, False):
        return
    setattr(instance, _PASSWORD_CHANGED, False)
    api_tokens_revoke(tokens=ApiToken.objects.filter(user=instance), reason="password changed")
