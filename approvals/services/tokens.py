"""API tokens: only a hash is stored; the token is shown once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from ..models import ApiToken


def api_token_create(*, user: Any, name: str = "") -> tuple[str, ApiToken]:
    token = ApiToken.generate()
    row = ApiToken.objects.create(
        user=user, name=name[:100], prefix=token[:12], key_hash=ApiToken.hash(token)
    )
    return token, row


def api_token_authenticate(token: str) -> Any:
    """The active user a bearer token belongs to, or None."""
    if not token or len(token) > 200:
        return None
    row = (
        ApiToken.objects.select_related("user")
        .filter(key_hash=ApiToken.hash(token), revoked_at__isnull=True)
        .first()
    )
    if row is None or not row.user.is_active:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=row.pk).update(
            last_used_at=now
        )  # throttled: not a write per request
    return row.user
