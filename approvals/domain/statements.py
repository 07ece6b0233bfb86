"""The decision path's own statements, written once per shape and run with their values.

The ORM builds and compiles a statement every time it runs one; for the short statements a
decision and a resume are made of, that costs several times what the database takes to run
them (bench/statement_cost.py). The shapes here are few and run for every decision, so each
is built from the models' metadata (table and column names) once per database and shape,
and cached; each value still goes through its field's own preparation (`get_db_prep_save` /
`get_db_prep_value`), so JSON, datetimes and booleans are stored exactly as the ORM stores
them, and rows read back go through the fields' converters into model instances
(`Model.from_db`).

Conditions are equalities (never with None: say `<field>__isnull`), `<field>__ne` (SQL `<>`,
which, unlike `exclude()`, never matches a NULL), `<field>__in` (a list of values, one
shape per power of two; an empty list matches nothing without a statement) and
`<field>__isnull`. Values are plain values, not expressions: counters are added with
`add`. These statements send no model
signals (as `QuerySet.update` and `bulk_create` send none), so the `save()` calls they
replaced on the decision path no longer send `pre_save`/`post_save` for those rows.
`UPDATE ... RETURNING` and `INSERT ... RETURNING` need SQLite 3.35 or newer (check E008).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from django.db import connections, router
from django.db.models import Field, Model
from django.db.transaction import TransactionManagementError

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
    descending; `for_update`: lock them until the transaction ends, where the database can;
    as with the ORM, only inside a transaction)."""
    alias = router.db_for_read(model) if not for_update else router.db_for_write(model)
    connection = connections[alias]
    if for_update and connection.get_autocommit():
        raise TransactionManagementError("select(for_update=True) outside of a transaction")
    if _matches_nothing(where):
        return []
    shape = _select_sql(model, alias, _shape_keys(where), tuple(order_by), limit, for_update)
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, _where_params(shape, where, connection))
        rows = cursor.fetchall()
    if not rows:
        return []
    instance = _reader(model, alias, shape.read, connection)
    return [instance(row) for row in rows]


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
    if not values and not add:
        raise ValueError("update() with nothing to set")
    if _matches_nothing(where):
        return None if returning else 0
    alias = router.db_for_write(model)
    connection = connections[alias]
    shape = _update_sql(
        model, alias, tuple(values), tuple(add or ()), _shape_keys(where), returning
    )
    params = [
        field.get_db_prep_save(_plain(name, values[name]), connection)
        for name, field in zip(values, shape.write, strict=True)
    ]
    params += [int(n) for n in (add or {}).values()]
    params += _where_params(shape, where, connection)
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, params)
        if not returning:
            return cursor.rowcount
        row = cursor.fetchone()
    return _reader(model, alias, shape.read, connection)(row) if row is not None else None


def insert(rows: Iterable[Model], *, keys: bool = False) -> None:
    """INSERT unsaved instances of one model in one statement, their `pre_save` values
    (auto_now_add) included; an auto-generated key is left to the database. With `keys`,
    each row gets its new key and counts as saved (as `bulk_create` reads them back);
    without, keys are not read (audit events)."""
    rows = list(rows)
    if not rows:
        return
    model = type(rows[0])
    if any(type(row) is not model for row in rows):
        raise ValueError("insert() takes rows of one model")
    alias = router.db_for_write(model)
    connection = connections[alias]
    shape = _insert_sql(model, alias, len(rows), keys)
    params = [
        field.get_db_prep_save(_plain(field.name, field.pre_save(row, add=True)), connection)
        for row in rows
        for field in shape.write
    ]
    with connection.cursor() as cursor:
        cursor.execute(shape.sql, params)
        if not keys:
            return
        # In the order of the VALUES: what PostgreSQL and SQLite do in practice, which
        # bulk_create relies on too.
        created = cursor.fetchall()
    for row, (key,) in zip(rows, created, strict=True):
        row.pk = key
        row._state.adding, row._state.db = False, alias


# -- shapes, built once per database -----------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """A statement's SQL, the fields its values are prepared by (set, then condition), and
    the fields of the columns it reads back."""

    sql: str
    write: tuple[Field, ...] = ()
    conditions: tuple[tuple[str, Field], ...] = ()  # (key in `where`, field): a parameter each
    read: tuple[Field, ...] = ()


def _plain(name: str, value: Any) -> Any:
    if hasattr(value, "resolve_expression"):
        raise TypeError(f"{name}: an expression; statements take values (counters: add=)")
    return value


def _field(model: type[Model], name: str) -> Field:
    if name == "pk":
        return model._meta.pk
    return model._meta.get_field(name)  # a foreign key's attname (run_id) finds it too


def _quote(alias: str, name: str) -> str:
    return connections[alias].ops.quote_name(name)


def _where_clause(
    model: type[Model], alias: str, keys: Sequence[str]
) -> tuple[str, list[tuple[str, Field]]]:
    parts, conditions = [], []
    for key in keys:
        name, _, op = key.partition("__")
        op, _, count = op.partition("#")  # `__in#3`: three values
        field = _field(model, name)
        column = _quote(alias, field.column)
        if op in ("isnull", "notnull"):  # no value: the test is part of the shape
            parts.append(f"{column} IS {'NOT ' if op == 'notnull' else ''}NULL")
            continue
        if op == "in":
            conditions.append((key, field))
            parts.append(f"{column} IN ({', '.join(['%s'] * int(count))})")
            continue
        if op not in _OPERATORS:
            raise ValueError(f"unsupported condition {key!r}")
        conditions.append((key, field))
        parts.append(f"{column} {_OPERATORS[op]}")
    return " AND ".join(parts) or "1 = 1", conditions


def _matches_nothing(where: Mapping[str, Any]) -> bool:
    """An `__in` condition with no values (`IN ()` is no SQL): no row, no statement."""
    return any(k.endswith("__in") and not _values(k, v) for k, v in where.items())


def _padded(count: int) -> int:
    """How many values an `__in` shape takes for `count`: the next power of two, so that the
    shapes (and the statements PostgreSQL prepares) stay few."""
    return 1 << max(0, count - 1).bit_length()


def _values(key: str, value: Any) -> list[Any]:
    """An `__in` condition's values."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        raise TypeError(f"{key}: a list of values")
    return list(value)


def _where_params(shape: _Shape, where: Mapping[str, Any], connection: Any) -> list[Any]:
    params = []
    for key, field in shape.conditions:
        name = key.partition("#")[0]
        if name.endswith("__in"):  # padded with its last value: a shape per power of two
            values = _values(name, where[name])
            values += values[-1:] * (_padded(len(values)) - len(values))
        else:
            values = [where[name]]
        for value in values:
            if value is None:  # `= NULL` matches nothing, where the ORM's `f=None` is IS NULL
                raise ValueError(f"{name}: None; say {name.partition('__')[0]}__isnull")
            params.append(field.get_db_prep_value(_plain(name, value), connection, prepared=False))
    return params


def _shape_keys(where: Mapping[str, Any]) -> tuple[str, ...]:
    """`where`'s keys as a shape: `<field>__isnull` becomes `__isnull` or `__notnull` by its
    value, which the SQL carries (a NULL test takes no parameter); `<field>__in` carries its
    count (`__in#3`)."""
    keys = []
    for k, v in where.items():
        if k.endswith("__isnull"):
            k = k if v else k.removesuffix("__isnull") + "__notnull"
        elif k.endswith("__in"):
            k = f"{k}#{_padded(len(_values(k, v)))}"
        keys.append(k)
    return tuple(keys)


def _columns(model: type[Model], alias: str) -> tuple[str, tuple[Field, ...]]:
    if model._meta.parents:  # its fields live in two tables: only the ORM joins them
        raise ValueError(f"{model.__name__} inherits another model's table")
    fields = tuple(model._meta.concrete_fields)
    table = _quote(alias, model._meta.db_table)
    return ", ".join(f"{table}.{_quote(alias, f.column)}" for f in fields), fields


@lru_cache(maxsize=256)
def _select_sql(
    model: type[Model],
    alias: str,
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
    return _Shape(sql, conditions=tuple(conditions), read=fields)


@lru_cache(maxsize=256)
def _update_sql(
    model: type[Model],
    alias: str,
    names: tuple[str, ...],
    counters: tuple[str, ...],
    keys: tuple[str, ...],
    returning: bool,
) -> _Shape:
    table = _quote(alias, model._meta.db_table)
    write = tuple(_field(model, n) for n in names)
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
    return _Shape(sql, write=write, conditions=tuple(conditions), read=read)


@lru_cache(maxsize=64)
def _insert_sql(model: type[Model], alias: str, count: int, keys: bool) -> _Shape:
    auto = model._meta.auto_field  # a key the database generates: never written
    write = tuple(f for f in model._meta.concrete_fields if f is not auto)
    table = _quote(alias, model._meta.db_table)
    columns = ", ".join(_quote(alias, f.column) for f in write)
    one = "(" + ", ".join(["%s"] * len(write)) + ")"
    sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * count)}"
    if keys:
        sql += f" RETURNING {_quote(alias, model._meta.pk.column)}"
    return _Shape(sql, write=write)


@lru_cache(maxsize=64)
def _field_converters(model: type[Model], alias: str, fields: tuple[Field, ...]) -> tuple[Any, ...]:
    """Each read column with its field's own converters (from_db_value; they depend on the
    database's features, not on one connection). The backend's converters, bound to a
    connection, are asked of the connection at hand (`_reader`)."""
    connection = connections[alias]
    cols = [f.get_col(model._meta.db_table) for f in fields]
    return tuple((col, tuple(col.get_db_converters(connection))) for col in cols)


def _reader(
    model: type[M], alias: str, fields: tuple[Field, ...], connection: Any
) -> Callable[[Sequence[Any]], M]:
    """A statement's rows into instances: the converters are gathered once per statement,
    and only the columns that have any are converted."""
    converting = []
    for i, (col, own) in enumerate(_field_converters(model, alias, fields)):
        converters = (*connection.ops.get_db_converters(col), *own)
        if converters:
            converting.append((i, col, converters))
    names = [f.attname for f in fields]

    def instance(row: Sequence[Any]) -> M:
        values = list(row)
        for i, col, converters in converting:
            for convert in converters:
                values[i] = convert(values[i], col, connection)
        return model.from_db(alias, names, values)

    return instance
