""" "All matching" as it stood when the reviewer chose it: the ids of the requests a list's
filters matched at that moment, in a signed token (django.core.signing, compressed) that the
page, or an API client, hands back with the bulk decision. The decision takes exactly those
ids, each still checked for access and state as it is decided (services.requests_bulk): a
request that enters the filters later (a claim released under "unclaimed", an un-hidden
one, a new arrival) is not taken with them. A token, not a server-side record: any server
process reads it, whatever the topology, and nothing is left behind to clean up."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.core import signing

from . import selectors
from .permissions import hidden_agents

SALT = "approvals.bulk-snapshot"
MAX_AGE = timedelta(days=1)  # as long as a drawn list's "all matching" may be used
STALE = (
    "“All matching” was chosen on another list, by someone else, or too long ago: choose it "
    "again on the list as it is now. Nothing was decided."
)


class StaleSnapshot(ValueError):
    """The token is not one this viewer took for these filters within MAX_AGE."""


@dataclass(frozen=True)
class Snapshot:
    token: str
    ids: list[str]


def filters_key(query: selectors.InboxQuery) -> str:
    """The filters a snapshot was taken for, as the list's URL has them."""
    return urlencode(query.as_params())


def take(
    query: selectors.InboxQuery,
    *,
    user: Any,
    upto: int | None = None,
    now: Any = None,
    limit: int = selectors.MAX_BULK_IDS,
) -> Snapshot:
    """The ids the query matches for `user` now (at most `limit`, in the list's order; with
    `upto`, none newer than that request pk; `now`: the moment snoozes and claims are read
    at, the list's drawing), signed for that user and these filters."""
    ids = selectors.request_ids_matching(
        query,
        user_id=user.pk,
        hidden_agents=hidden_agents(user),
        limit=limit,
        upto=upto,
        now=now,
    )
    payload = {"u": user.pk, "f": filters_key(query), "i": ids}
    return Snapshot(token=signing.dumps(payload, salt=SALT, compress=True), ids=ids)


def read(token: str, *, user: Any, query: selectors.InboxQuery | None = None) -> list[str]:
    """The ids of a token `take` gave `user` (for `query`'s filters, when given). Raises
    StaleSnapshot for anything else: tampered, expired, another user's, other filters."""
    try:
        payload = signing.loads(token or "", salt=SALT, max_age=MAX_AGE)
    except signing.BadSignature:  # SignatureExpired is one
        raise StaleSnapshot(STALE) from None
    if not isinstance(payload, dict) or payload.get("u") != user.pk:
        raise StaleSnapshot(STALE)
    if query is not None and payload.get("f") != filters_key(query):
        raise StaleSnapshot(STALE)
    ids = payload.get("i")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise StaleSnapshot(STALE)
    return ids
