"""Reads for the team dashboard (/reports/): every figure is aggregated in the database, on
SQLite and PostgreSQL alike, and a read returns at most a few rows per agent, reviewer, day
or reason, never one per request.

Percentiles are nearest-rank (the smallest time with at least that share of decisions at or
under it; an interpolated percentile would not be a time any decision took). PostgreSQL
computes them with its ordered-set aggregate PERCENTILE_DISC, which is nearest-rank; SQLite,
which has none, picks the rows at those ranks with window functions (ROW_NUMBER and COUNT
over each agent's or reviewer's decisions): the same figures, and at 100k decisions over 90
days the aggregate reads them about three times faster (bench/inbox_scale.py --only reports).

Decisions are requests approved, answered or declined (by a person or a rule) whose
`decided_at` falls in the period; time to decision counts people's decisions only (a rule
decides before anyone could look). Requests of agents the viewer may not see are left out
(`hidden_agents`, as every read)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import (
    Aggregate,
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Q,
    Value,
    When,
    Window,
)
from django.db.models.functions import RowNumber, TruncDate

from ..models import ApprovalRequest

REPORT_PERIODS = (7, 30, 90)  # days the period selector offers
DECIDED_STATES = ("approved", "answered", "declined")
# How long a pending request has waited: (label, at least, less than); the last has no end.
AGE_BUCKETS: tuple[tuple[str, timedelta, timedelta | None], ...] = (
    ("under 1 hour", timedelta(0), timedelta(hours=1)),
    ("1 to 4 hours", timedelta(hours=1), timedelta(hours=4)),
    ("4 to 24 hours", timedelta(hours=4), timedelta(days=1)),
    ("1 to 7 days", timedelta(days=1), timedelta(days=7)),
    ("over 7 days", timedelta(days=7), None),
)
TOP_REASONS = 10


@dataclass(frozen=True)
class DecisionTimes:
    """One agent's or reviewer's people's decisions in the period: how many, and the median and
    90th percentile of the time from arrival to decision."""

    key: str
    decisions: int
    median: timedelta
    p90: timedelta


def _visible(qs, hidden_agents: Collection[str]):
    return qs.exclude(agent__in=list(hidden_agents)) if hidden_agents else qs


def requests_per_day(
    *, since: datetime, hidden_agents: Collection[str] = ()
) -> list[tuple[Any, int, int]]:
    """(day, arrived, declined of those) for each day (a date in the current time zone)
    a request arrived on since `since`, oldest first; days with none are left out."""
    qs = _visible(ApprovalRequest.objects.filter(created_at__gte=since), hidden_agents)
    rows = (
        qs.annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(arrived=Count("id"), declined=Count("id", filter=Q(state="declined")))
        .order_by("day")
    )
    return [(row["day"], row["arrived"], row["declined"]) for row in rows]


class _PercentileDisc(Aggregate):
    """PostgreSQL's PERCENTILE_DISC(fraction) WITHIN GROUP (ORDER BY expression)."""

    function = "PERCENTILE_DISC"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


def _by_rank(rows: list[DecisionTimes]) -> list[DecisionTimes]:
    return sorted(rows, key=lambda row: (-row.decisions, row.key))


def _decision_times(qs, key: str) -> list[DecisionTimes]:
    """Median and p90 per `key` group, nearest-rank, in one query."""
    took = ExpressionWrapper(F("decided_at") - F("created_at"), output_field=DurationField())
    if connections[qs.db].vendor == "postgresql":
        rows = (
            qs.annotate(took=took, group_key=F(key))
            .values("group_key")
            .annotate(
                n=Count("pk"),
                median=_PercentileDisc(F("took"), 0.5, output_field=DurationField()),
                p90=_PercentileDisc(F("took"), 0.9, output_field=DurationField()),
            )
            .order_by()
        )
        return _by_rank(
            [
                DecisionTimes(
                    key=str(r["group_key"]), decisions=r["n"], median=r["median"], p90=r["p90"]
                )
                for r in rows
            ]
        )
    # Each decision ranked within its group by how long it took, and only the rows at the two
    # ranks come back (one row when both ranks are the same row).
    group = [F(key)]
    ranked = (
        qs.annotate(took=took)
        .annotate(
            rank=Window(RowNumber(), partition_by=group, order_by=[F("took").asc(), F("pk").asc()]),
            n=Window(Count("pk"), partition_by=group),
        )
        # ceil(n/2) and ceil(9n/10) in integer arithmetic (the same on both databases)
        .annotate(
            r50=ExpressionWrapper((F("n") + 1) / 2, output_field=IntegerField()),
            r90=ExpressionWrapper((F("n") * 9 + 9) / 10, output_field=IntegerField()),
        )
    )
    # One query for both ranks: a filter on window values may not use OR, so a CASE marks the
    # rows at rank r50 or r90 and the filter asks for the mark.
    ranked = ranked.annotate(
        at_rank=Case(
            When(rank=F("r50"), then=Value(1)),
            When(rank=F("r90"), then=Value(1)),
            default=Value(0),
            output_field=IntegerField(),
        ),
        group_key=F(key),
    ).filter(at_rank=1)
    out: dict[str, dict[str, Any]] = {}
    for name, n, value, rank, r50, r90 in ranked.values_list(
        "group_key", "n", "took", "rank", "r50", "r90"
    ):
        figures = out.setdefault(str(name), {"decisions": n})
        if rank == r50:
            figures["median"] = value
        if rank == r90:
            figures["p90"] = value
    return _by_rank([DecisionTimes(key=name, **fig) for name, fig in out.items()])


def decision_times(
    *, since: datetime, hidden_agents: Collection[str] = ()
) -> dict[str, list[DecisionTimes]]:
    """{"agent": [...], "reviewer": [...]}: people's decisions since `since`, per agent and
    per reviewer (by username), most decisions first."""
    people = _visible(
        ApprovalRequest.objects.filter(
            state__in=DECIDED_STATES, decided_at__gte=since, decided_by__isnull=False
        ),
        hidden_agents,
    ).order_by()
    return {
        "agent": _decision_times(people, "agent"),
        "reviewer": _decision_times(people, "decided_by__username"),
    }


def decline_figures(
    *, since: datetime, hidden_agents: Collection[str] = ()
) -> tuple[list[tuple[str, int, int]], list[tuple[str, int]]]:
    """([(agent, decisions, declines)], [(reason, declines)]): decisions since `since` per
    agent (most first), and the most common decline reasons (exact text, most first)."""
    decided = _visible(
        ApprovalRequest.objects.filter(state__in=DECIDED_STATES, decided_at__gte=since),
        hidden_agents,
    )
    per_agent = (
        decided.values("agent")
        .annotate(decisions=Count("id"), declines=Count("id", filter=Q(state="declined")))
        .order_by("-decisions", "agent")
    )
    reasons = (
        decided.filter(state="declined")
        .values("reason")
        .annotate(declines=Count("id"))
        .order_by("-declines", "reason")[:TOP_REASONS]
    )
    return (
        [(row["agent"], row["decisions"], row["declines"]) for row in per_agent],
        [(row["reason"], row["declines"]) for row in reasons],
    )


def waiting_by_age(*, now: datetime, hidden_agents: Collection[str] = ()) -> list[tuple[str, int]]:
    """[(bucket label, pending requests)] for AGE_BUCKETS, youngest first, in one query."""
    counts = {}
    for i, (_label, least, under) in enumerate(AGE_BUCKETS):
        q = Q(created_at__lte=now - least)
        if under is not None:
            q &= Q(created_at__gt=now - under)
        counts[f"b{i}"] = Count("id", filter=q)
    pending = _visible(ApprovalRequest.objects.filter(state="pending"), hidden_agents)
    figures = pending.aggregate(**counts)
    return [(label, figures[f"b{i}"]) for i, (label, _least, _under) in enumerate(AGE_BUCKETS)]
