"""Counting statements compiled once per shape and bound to the moment at each use."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connections
from django.db.models import (
    BooleanField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)

from ..conf import app_settings
from ..models import ApprovalRequest, RequestHide
from .inbox_query import InboxQuery, _all_of, _claim_cutoff


def _newest_sql(rows: QuerySet) -> _Sql:
    """The highest request pk among `rows` (requests, or the viewer's hides of them:
    `_hidden_rows`), as an SQL expression: NULL when there is none."""
    key = "request_id" if rows.model is RequestHide else "pk"
    newest = rows.order_by(f"-{key}").values(key)[:1]
    sql, params = newest.query.get_compiler(using=newest.db).as_sql()
    return _Sql(f"({sql})", tuple(params), newest.db)


def _hidden_rows(
    base: QuerySet[ApprovalRequest], conditions: dict[str, Q | None], hides: QuerySet
) -> QuerySet:
    """The viewer's hidden rows that meet `conditions`, read from the viewer's own hides: each
    hide looks up its one request (a LIMIT 1 subquery, so the planner keeps it a lookup by
    key instead of reading every request to join them)."""
    others = {name: q for name, q in conditions.items() if name != "hidden"}
    match = base.filter(_all_of(others.values()), pk=OuterRef("request_id")).order_by().values("pk")
    return hides.annotate(match=Subquery(match[:1])).filter(match__isnull=False)


@dataclass(frozen=True)
class _Either:
    """Rows counted one of two ways, whichever reads fewer: `few` when `probe` (a superset
    of them) has no more rows than the cap, else `many` (`_capped_sql` counts each up to
    the cap + 1, and PostgreSQL runs only the branch of the CASE it takes)."""

    probe: QuerySet
    few: QuerySet
    many: QuerySet


@dataclass(frozen=True)
class _Sql:
    """A count compiled: an SQL expression and its parameters."""

    sql: str
    params: tuple
    db: str

    def bind(self, placeholder: str, value: str) -> _Sql:
        params = tuple(value if p == placeholder else p for p in self.params)
        return _Sql(self.sql, params, self.db)

    def at(self, now: Any) -> _Sql:
        """Compiled at `_STAND_IN_NOW`, bound to `now`: each value derived from the stand-in
        (`_moments`), as the ORM passed it or as the database's adapter wrote it, becomes
        the same value derived from `now`."""
        adapt = connections[self.db].ops.adapt_datetimefield_value
        swap: dict[Any, Any] = {}
        for stand_in, real in zip(_moments(_STAND_IN_NOW), _moments(now), strict=True):
            swap[stand_in] = real
            swap[adapt(stand_in)] = adapt(real)
        params = tuple(swap.get(p, p) if isinstance(p, (datetime, str)) else p for p in self.params)
        return _Sql(self.sql, params, self.db)


def _capped_sql(counted: QuerySet | _Either, cap: int) -> _Sql:
    """The count of `counted`'s rows, stopping at `cap` + 1, as an SQL expression."""
    if isinstance(counted, _Either):
        probe, few, many = (
            _capped_sql(qs, cap) for qs in (counted.probe, counted.few, counted.many)
        )
        return _Sql(
            f"CASE WHEN {probe.sql} <= {int(cap)} THEN {few.sql} ELSE {many.sql} END",
            probe.params + few.params + many.params,
            probe.db,
        )
    limited = counted.order_by().values("pk")[: cap + 1]
    sql, params = limited.query.get_compiler(using=limited.db).as_sql()
    return _Sql(f"(SELECT COUNT(*) FROM ({sql}) AS counted)", tuple(params), limited.db)


# -- counting statements, compiled once per shape ------------------------------------------


@dataclass(frozen=True)
class _CountShape:
    """What a count's SQL depends on, but the moment: compiling it takes the ORM longer than
    PostgreSQL takes to run it (bench/inbox_scale.py at 100k pending: 12 ms of a page's
    44 ms, the statements 9), so it is done once per shape and bound to each `now`."""

    query: InboxQuery
    user_id: Any
    hidden_agents: tuple[str, ...]
    cap: int
    options: tuple[tuple[str, tuple[str, ...]], ...]  # ((menu, (value, ...)), ...)
    newest: bool


@dataclass(frozen=True)
class _Statement:
    """A compiled statement of one row: its values' names, and for the menus' options which
    (menu, value) each `option_N` counts."""

    sql: _Sql
    columns: tuple[str, ...]
    options: tuple[tuple[str, str, str], ...] = ()  # ((column, menu, value), ...)


# The moment a statement is compiled at, standing for the `now` it is bound to (`_Sql.at`):
# no real moment of a request or a hide is this one.
_STAND_IN_NOW = datetime(1901, 2, 3, 4, 5, 6, 78901, tzinfo=UTC)
_STATEMENTS: dict[tuple, _Statement] = {}
# Shapes times viewers (a search text is a shape of its own); an entry is a few kB, up to
# 50 kB for a viewer's hidden requests counted over 30 agents' options.
_MAX_STATEMENTS = 1000


def _moments(now: Any) -> tuple:
    """Every value derived from `now` that a count compares with: `now`, and the claim
    cutoff when claims lapse."""
    cutoff = _claim_cutoff(now)
    return (now,) if cutoff is None else (now, cutoff)


def _statement(build: Any, shape: _CountShape) -> _Statement:
    """`build(shape, at)`'s statement, compiled at the stand-in moment once per shape (and
    per database and claim time, which the SQL depends on too)."""
    key = (build, shape, ApprovalRequest.objects.db, int(app_settings.CLAIM_MINUTES or 0))
    statement = _STATEMENTS.get(key)
    if statement is None:
        statement = build(shape, _STAND_IN_NOW)
        while len(_STATEMENTS) >= _MAX_STATEMENTS:  # the oldest goes (another thread may too)
            with suppress(KeyError, RuntimeError, StopIteration):
                del _STATEMENTS[next(iter(_STATEMENTS))]
        _STATEMENTS[key] = statement
    return statement


def _run(statement: _Statement, now: Any) -> dict[str, int]:
    """The statement's one row at the moment `now`, by column name.

    On PostgreSQL the values go into the statement as literals (quoted by psycopg on the
    client, as Django's default binding does): with server-side binding a statement run 5
    times is prepared and may get a generic plan, made without the values, in which a
    filter menu's option that matches no row (a decided state, a rare kind) is estimated
    as common and its count reads to the end of an index (100k pending: 27 ms for the
    inbox's first count instead of 2)."""
    values = _fetch_one(statement.sql.at(now))
    return {name: int(value or 0) for name, value in zip(statement.columns, values, strict=True)}


def _fetch_one(bound: _Sql) -> tuple:
    """A compiled statement's one row, its values as literals on PostgreSQL (`_run`)."""
    connection = connections[bound.db]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(connection.ops.compose_sql(bound.sql, list(bound.params)))
        else:
            cursor.execute(bound.sql, bound.params)
        return cursor.fetchone()


def _select(parts: Mapping[str, _Sql], **extra: Any) -> _Statement:
    """One statement selecting each expression of `parts`, named by its key."""
    db = next(iter(parts.values())).db
    sql = "SELECT " + ", ".join(part.sql for part in parts.values())
    params = tuple(p for part in parts.values() for p in part.params)
    return _Statement(_Sql(sql, params, db), tuple(parts), **extra)


def _filtered_counts(
    rows: QuerySet,
    counts: Mapping[str, Q],
    *,
    highest: Mapping[str, Q] | None = None,
    limit: int | None = None,
    also: Mapping[str, _Sql] | None = None,
) -> _Statement:
    """One scan of `rows` (its first `limit` only, with one): for each of `counts` the rows
    meeting its condition, for each of `highest` the highest pk among them (0 if none), and
    `also`'s expressions (subqueries of their own). The conditions are the rows' boolean
    columns, counted around them."""
    conditions = {**counts, **(highest or {})}
    assert len(conditions) == len(counts) + len(highest or {}), "a name counted twice"
    flags = {
        f"flag_{i}": ExpressionWrapper(condition, output_field=BooleanField())
        if condition
        else Value(True)
        for i, condition in enumerate(conditions.values())
    }
    inner = rows.order_by().annotate(row_key=F("pk"), **flags).values("row_key", *flags)
    if limit is not None:
        inner = inner[:limit]
    sql, params = inner.query.get_compiler(using=inner.db).as_sql()
    names = list(flags)
    columns = [f"COUNT(CASE WHEN {flag} THEN 1 END)" for flag in names[: len(counts)]]
    columns += [f"MAX(CASE WHEN {flag} THEN row_key END)" for flag in names[len(counts) :]]
    also = also or {}
    columns += [part.sql for part in also.values()]
    params = (*(p for part in also.values() for p in part.params), *params)
    return _Statement(
        _Sql(f"SELECT {', '.join(columns)} FROM ({sql}) AS counted_rows", params, inner.db),
        (*conditions, *also),
    )
