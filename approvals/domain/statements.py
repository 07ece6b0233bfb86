"""The decision path's own statements, written once per shape and run with their values.

The ORM builds and compiles a statement every time it runs one; for the short statements a
decision and a resume are made of, that costs several times what the database takes to run
them (bench/statement_cost.py: 0.6 to 1.0 ms of CPU per statement, against 0.15 to 0.2 ms
for the same SQL through the cursor). The shapes here are few and run for every decision,
so each is built from the models' metadata (table and column names) once per database and
shape, and cached; each value still goes through its field's own preparation
(`get_db_prep_save` / `get_db_prep_value`), so JSON, datetimes and booleans are stored
exactly as the ORM stores them, and rows read back go through the fields' converters into
model instances (`Model.from_db`).

Conditions are equalities, `<field>__ne` (not equal) and `<field>__isnull`. These
statements send no model signals (as `QuerySet.update` and `bulk_create` send none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from django.db import connections, router
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)

_OPERATORS = {"": "= %s", "ne": "<> %s"}


def select(
    model: type[M],
    where: Mapping[str, Any],
    *,
    order_by: Sequence[str] = (),
    limit: int | None = None,
    for_update: bool = False,
) -> list[M]:
    """Whole rows of `model` meeting `where`, as instances (`order_by`: field names, `-` for
    descending; `for_update`: lock them where the database can)."""
    alias = router.db_for_read(model) if not for_update else router.db_for_write(model)
    connection = connections[alias]
    shape = _select_sql(
        model, alias, connection.vendor, _shape_keys(where), tuple(order_by), limit, for_update
    )
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, _where_params(shape, where, connection))
        rows = cursor.fetchall()
    return [_instance(model, alias, shape.read, row, connection) for row in rows]


def update(
    model: type[Model],
    where: Mapping[str, Any],
    values: Mapping[str, Any],
    *,
    add: Mapping[str, int] | None = None,
    returning: bool = False,
) -> Any:
    """UPDATE the rows of `model` meeting `where`: set `values`, add `add` to counters (in
    the statement itself). How many rows changed; with `returning`, the first changed row
    as it is now (an instance) or None."""
    alias = router.db_for_write(model)
    connection = connections[alias]
    shape = _update_sql(
        model,
        alias,
        connection.vendor,
        tuple(values),
        tuple(add or ()),
        _shape_keys(where),
        returning,
    )
    params = [
        field.get_db_prep_save(values[name], connection)
        for name, field in zip(values, shape.write, strict=True)
    ]
    params += [int(n) for n in (add or {}).values()]
    params += _where_params(shape, where, connection)
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, params)
        if not returning:
            return cursor.rowcount
        row = cursor.fetchone()
    return _instance(model, alias, shape.read, row, connection) if row is not None else None


def insert(rows: Iterable[Model], *, keys: bool = False) -> None:
    """INSERT unsaved instances of one model in one statement, their `pre_save` values
    (auto_now_add) included. With `keys`, each row gets its new primary key and counts as
    saved (as `bulk_create` reads them back); without, keys are not read (audit events)."""
    rows = list(rows)
    if not rows:
        return
    model = type(rows[0])
    alias = router.db_for_write(model)
    connection = connections[alias]
    shape = _insert_sql(model, alias, connection.vendor, len(rows), keys)
    params = [
        field.get_db_prep_save(field.pre_save(row, add=True), connection)
        for row in rows
        for field in shape.write
    ]
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, params)
        if not keys:
            return
        # In the order of the VALUES, as PostgreSQL and SQLite return them (bulk_create
        # relies on the same).
        created = cursor.fetchall()
    for row, (key,) in zip(rows, created, strict=True):
        row.pk = key
        row._state.adding, row._state.db = False, alias


# -- shapes, built once per database -----------------------------------------------------------


class _Shape:
    """A statement's SQL, the fields its values are prepared by (set, then condition), and
    the fields of the columns it reads back (with their converters, per database)."""

    def __init__(
        self,
        sql: str,
        write: Sequence[Field] = (),
        conditions: Sequence[tuple[str, Field, str]] = (),
        read: tuple[Any, ...] = (),
    ) -> None:
        self.sql = sql
        self.write = tuple(write)
        self.conditions = tuple(conditions)  # (key in `where`, field, operator)
        self.read = read


def _field(model: type[Model], name: str) -> Field:
    if name == "pk":
        return model._meta.pk
    return model._meta.get_field(name)  # a foreign key's attname (run_id) finds it too


def _quote(alias: str, name: str) -> str:
    return connections[alias].ops.quote_name(name)


def _where_clause(
    model: type[Model], alias: str, keys: Sequence[str]
) -> tuple[str, list[tuple[str, Field, str]]]:
    parts, conditions = [], []
    for key in keys:
        name, _, op = key.partition("__")
        field = _field(model, name)
        column = _quote(alias, field.column)
        if op in ("isnull", "notnull"):  # no value: the test is part of the shape
            parts.append(f"{column} IS {'NOT ' if op == 'notnull' else ''}NULL")
            continue
        if op not in _OPERATORS:
            raise ValueError(f"unsupported condition {key!r}")
        conditions.append((key, field, op))
        parts.append(f"{column} {_OPERATORS[op]}")
    return " AND ".join(parts) or "1 = 1", conditions


def _where_params(shape: _Shape, where: Mapping[str, Any], connection: Any) -> list[Any]:
    return [
        field.get_db_prep_value(where[key], connection, prepared=False)
        for key, field, _ in shape.conditions
    ]


def _shape_keys(where: Mapping[str, Any]) -> tuple[str, ...]:
    """`where`'s keys as a shape: `<field>__isnull` becomes `__isnull` or `__notnull` by its
    value, which the SQL carries (a NULL test takes no parameter)."""
    return tuple(
        (k if v else k.removesuffix("__isnull") + "__notnull") if k.endswith("__isnull") else k
        for k, v in where.items()
    )


def _columns(model: type[Model], alias: str) -> tuple[str, tuple[Field, ...]]:
    fields = tuple(model._meta.concrete_fields)
    table = _quote(alias, model._meta.db_table)
    return ", ".join(f"{table}.{_quote(alias, f.column)}" for f in fields), fields


@lru_cache(maxsize=256)
def _select_sql(
    model: type[Model],
    alias: str,
    vendor: str,
    keys: tuple[str, ...],
    order_by: tuple[str, ...],
    limit: int | None,
    for_update: bool,
) -> _Shape:
    columns, fields = _columns(model, alias)
    where, conditions = _where_clause(model, alias, keys)
    sql = f"SELECT {columns} FROM {_quote(alias, model._meta.db_table)} WHERE {where}"
    if order_by:
        sql += " ORDER BY " + ", ".join(
            f"{_quote(alias, _field(model, o.lstrip('-')).column)}"
            + (" DESC" if o.startswith("-") else " ASC")
            for o in order_by
        )
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    if for_update and connections[alias].features.has_select_for_update:
        sql += " FOR UPDATE"
    return _Shape(sql, conditions=conditions, read=fields)


@lru_cache(maxsize=256)
def _update_sql(
    model: type[Model],
    alias: str,
    vendor: str,
    names: tuple[str, ...],
    counters: tuple[str, ...],
    keys: tuple[str, ...],
    returning: bool,
) -> _Shape:
    table = _quote(alias, model._meta.db_table)
    write = [_field(model, n) for n in names]
    sets = [f"{_quote(alias, f.column)} = %s" for f in write]
    for name in counters:
        column = _quote(alias, _field(model, name).column)
        sets.append(f"{column} = {column} + %s")
    where, conditions = _where_clause(model, alias, keys)
    sql = f"UPDATE {table} SET {', '.join(sets)} WHERE {where}"
    read: tuple[Field, ...] = ()
    if returning:
        columns, read = _columns(model, alias)
        sql += f" RETURNING {columns}"
    return _Shape(sql, write=write, conditions=conditions, read=read)


@lru_cache(maxsize=64)
def _insert_sql(model: type[Model], alias: str, vendor: str, count: int, keys: bool) -> _Shape:
    write = [f for f in model._meta.concrete_fields if not f.primary_key]
    table = _quote(alias, model._meta.db_table)
    columns = ", ".join(_quote(alias, f.column) for f in write)
    one = "(" + ", ".join(["%s"] * len(write)) + ")"
    sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * count)}"
    if keys:
        sql += f" RETURNING {_quote(alias, model._meta.pk.column)}"
    return _Shape(sql, write=write)


@lru_cache(maxsize=64)
def _converters(model: type[Model], alias: str, fields: tuple[Field, ...]) -> tuple[Any, ...]:
    connection = connections[alias]
    out = []
    for field in fields:
        col = field.get_col(model._meta.db_table)
        out.append(
            (
                col,
                tuple(connection.ops.get_db_converters(col))
                + tuple(col.get_db_converters(connection)),
            )
        )
    return tuple(out)


def _instance(
    model: type[M], alias: str, fields: tuple[Field, ...], row: Sequence[Any], connection: Any
) -> M:
    values = list(row)
    for i, (col, converters) in enumerate(_converters(model, alias, fields)):
        for convert in converters:
            values[i] = convert(values[i], col, connection)
    return model.from_db(alias, [f.attname for f in fields], values)
