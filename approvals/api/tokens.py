"""API tokens: one's own, listed and revoked."""

from __future__ import annotations

from django.utils import timezone
from ninja import Query

from .. import selectors, services
from .core import api
from .schemas import ERRORS, TokenListFilter, TokenOut, TokenPage

# -- API tokens: one's own -----------------------------------------------------------------


@api.get(
    "/tokens",
    response={200: TokenPage, **ERRORS},
    tags=["tokens"],
    summary="List your own API tokens, newest first",
    description="Never shows a token's secret (only a hash is stored): tell tokens apart by"
    " `prefix` and `name`. `current` marks the token this request authenticated with.",
)
def list_tokens(request, filters: Query[TokenListFilter]):
    qs = selectors.token_list(user=request.user, state=filters.state or None)
    now = timezone.now()
    current = getattr(getattr(request, "api_token", None), "pk", None)
    page = qs[filters.offset : filters.offset + filters.limit]
    return {
        "items": [selectors.token_view(r, now=now, current_id=current) for r in page],
        "count": qs.count(),
    }


@api.post(
    "/tokens/{token_id}/revoke",
    response={200: TokenOut, **ERRORS},
    tags=["tokens"],
    summary="Revoke one of your own API tokens",
    description="The token stops working at once (401 'revoked'). Revoking a revoked token"
    " changes nothing; another user's token is 404. Revoking the token this request used is"
    " allowed: the answer is the last one it gets.",
)
def revoke_token(request, token_id: int):
    row = services.api_token_revoke(token_id=token_id, user=request.user)
    current = getattr(getattr(request, "api_token", None), "pk", None)
    return selectors.token_view(row, now=timezone.now(), current_id=current)
