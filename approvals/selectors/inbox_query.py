"""The triage inbox's query: its parameters (InboxQuery) and the conditions they make."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import (
    F,
    OuterRef,
    Q,
    QuerySet,
)

from ..conf import app_settings
from ..models import ApprovalRequest, RequestHide

State = ApprovalRequest.State


# -- the triage inbox (issue 14) -------------------------------------------------------------

INBOX_SORTS = ("newest", "oldest", "deadline")
INBOX_CLAIMS = ("", "mine", "unclaimed", "routed")
INBOX_HIDDEN = ("", "only")
MAX_SEARCH_CHARS = 200
MAX_BULK_IDS = 500
_TRUE = ("1", "true", "on", "yes")


def param_text(params: Any, name: str) -> str:
    """One GET parameter as clean text: a QueryDict's last value, a dict's value, never a
    list; NUL removed (it never names anything, and PostgreSQL refuses it in a query)."""
    value = params.get(name, "") if params is not None else ""
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else ""
    return str(value if value is not None else "").replace("\x00", "").strip()


@dataclass(frozen=True)
class InboxQuery:
    """What the inbox shows: filters, search and sort, as read from a page's GET parameters
    (`from_params`, tolerant) and written back into its links (`as_params`)."""

    state: str = "pending"  # an ApprovalRequest.State value, or "all"
    agent: str = ""
    kind: str = ""
    q: str = ""  # case-insensitive substring of prompt, agent, tool names, arguments
    claim: str = ""  # "" | "mine" | "unclaimed" (active claims only) | "routed" (to me)
    overdue: bool = False  # pending and expires_at < now
    hidden: str = ""  # "" = leave out what I snoozed/ignored | "only" = only those
    sort: str = "newest"  # "newest" | "oldest" | "deadline"

    @classmethod
    def from_params(cls, params: Any) -> InboxQuery:
        """Never raises: an unknown value is the default."""
        state = param_text(params, "state") or "pending"
        if state != "all" and state not in State.values:
            state = "pending"
        claim = param_text(params, "claim")
        hidden = param_text(params, "hidden")
        sort = param_text(params, "sort")
        return cls(
            state=state,
            agent=param_text(params, "agent")[:100],
            kind=param_text(params, "kind")[:50],
            q=" ".join(param_text(params, "q").split())[:MAX_SEARCH_CHARS],
            claim=claim if claim in INBOX_CLAIMS else "",
            overdue=param_text(params, "overdue").lower() in _TRUE,
            hidden=hidden if hidden in INBOX_HIDDEN else "",
            sort=sort if sort in INBOX_SORTS else "newest",
        )

    def as_params(self) -> dict[str, str]:
        """Only the values that differ from the defaults (for URLs), in a stable order."""
        out: dict[str, str] = {}
        default = InboxQuery()
        for name in ("state", "agent", "kind", "q", "claim", "hidden", "sort"):
            value = getattr(self, name)
            if value != getattr(default, name):
                out[name] = value
        if self.overdue:
            out["overdue"] = "1"
        return out


def _claim_cutoff(now: Any) -> Any:
    """Claims taken at or before this moment have lapsed (None: claims never lapse)."""
    minutes = int(app_settings.CLAIM_MINUTES or 0)
    return now - timedelta(minutes=minutes) if minutes > 0 else None


def _active_claim_q(now: Any) -> Q:
    active = Q(state=State.PENDING, claimed_by__isnull=False, claimed_at__isnull=False)
    cutoff = _claim_cutoff(now)
    return active & Q(claimed_at__gt=cutoff) if cutoff is not None else active


def _no_active_claim_q(now: Any) -> Q:
    """The negation of `_active_claim_q`, spelled out (NULLs included)."""
    free = Q(claimed_by__isnull=True) | Q(claimed_at__isnull=True) | ~Q(state=State.PENDING)
    cutoff = _claim_cutoff(now)
    return free | Q(claimed_at__lte=cutoff) if cutoff is not None else free


def _viewer_hides(user_id: Any, now: Any) -> QuerySet[RequestHide]:
    """The viewer's own hide of the row: snoozed until later than now, or ignored."""
    return _viewer_hides_q(user_id, now).filter(request_id=OuterRef("pk"))


def _viewer_hides_q(user_id: Any, now: Any) -> QuerySet[RequestHide]:
    """Every request the viewer hid: snoozed until later than now, or ignored."""
    return RequestHide.objects.filter(user_id=user_id).filter(
        Q(until__isnull=True) | Q(until__gt=now)
    )


def _viewer_groups(user_id: Any) -> QuerySet:
    """The ids of the viewer's groups, as a subquery."""
    return get_user_model().groups.through.objects.filter(user_id=user_id).values("group_id")


def _search_q(text: str) -> Q:
    """Case-insensitive substring over the stored lowercased search text (see
    ApprovalRequest.search_text: prompt, agent, tool names, arguments). On PostgreSQL a
    pg_trgm GIN index serves LIKE '%...%' (migration 0004)."""
    return Q(search_text__contains=text.lower())


def _inbox_base(query: InboxQuery, *, hidden_agents: Collection[str]) -> QuerySet[ApprovalRequest]:
    """The query's state, agent, kind and search filters, and per-agent access."""
    qs = ApprovalRequest.objects.all()
    if hidden_agents:
        qs = qs.exclude(agent__in=sorted(hidden_agents))
    if query.state and query.state != "all":
        qs = qs.filter(state=query.state)
    if query.agent:
        qs = qs.filter(agent=query.agent)
    if query.kind:
        qs = qs.filter(kind=query.kind)
    if query.q:
        qs = qs.filter(_search_q(query.q))
    return qs


def _chip_conditions(query: InboxQuery, *, user_id: Any, now: Any) -> dict[str, Q]:
    """Each chip's filter as a condition on rows annotated with `viewer_hidden` (see
    `inbox_matching`)."""
    active = _active_claim_q(now)
    return {
        "mine": active & Q(claimed_by_id=user_id),
        "unclaimed": _no_active_claim_q(now),
        # A route rule or an escalation routed it to the viewer, or to a group of theirs.
        "routed": Q(requirement__routed_user_id=user_id)
        | Q(requirement__routed_group_id__in=_viewer_groups(user_id)),
        "overdue": Q(state=State.PENDING, expires_at__lt=now),
        "hidden": Q(viewer_hidden=True),
        "shown": Q(viewer_hidden=False),
    }


def _query_conditions(query: InboxQuery, chips: dict[str, Q]) -> dict[str, Q | None]:
    """The query's own claim, overdue and hidden filters (None: no filter)."""
    return {
        "claim": chips[query.claim] if query.claim else None,
        "overdue": chips["overdue"] if query.overdue else None,
        "hidden": chips["hidden"] if query.hidden == "only" else chips["shown"],
    }


def _all_of(conditions: Collection[Q | None]) -> Q:
    out = Q()
    for condition in conditions:
        if condition is not None:
            out &= condition
    return out


def _inbox_order(sort: str) -> list[Any]:
    if sort == "oldest":
        return ["created_at", "id"]
    if sort == "deadline":
        return [F("expires_at").asc(nulls_last=True), "-created_at", "-id"]
    return ["-created_at", "-id"]


INBOX_ROW_DEFERRED = (
    "search_text",
    "run__messages",
    "run__system_prompt",
    "run__text",
    "run__usage",
    "run__error",
)
