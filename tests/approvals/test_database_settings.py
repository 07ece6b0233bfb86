"""How the project talks to PostgreSQL: server-side binding with prepared statements by
default (the decision path's statements parsed and planned once per connection), and
DATABASE_PREPARED=0 for a pooler that cannot keep them."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from approvals.models import Run

from .test_security_defaults import _python

pytestmark = pytest.mark.django_db

PG_URL = "postgres://someone@db.example:5432/toolnexus"  # settings only: nothing connects


def _database(tmp_path, **extra) -> dict:
    """The default database's settings as a fresh process with `extra` in its environment
    makes them."""
    done = _python(
        tmp_path,
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps(s.DATABASES['default'], default=str))",
        **extra,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _options(tmp_path, **extra) -> dict:
    return _database(tmp_path, **extra).get("OPTIONS", {})


def test_postgresql_binds_on_the_server_and_prepares_repeated_statements(tmp_path):
    options = _options(tmp_path, DATABASE_URL=PG_URL)
    assert options["server_side_binding"] is True
    assert options["prepare_threshold"] == 5


def test_database_prepared_0_binds_on_the_client(tmp_path):
    options = _options(tmp_path, DATABASE_URL=PG_URL, DATABASE_PREPARED="0")
    assert "server_side_binding" not in options and "prepare_threshold" not in options


def test_sqlite_has_no_postgresql_options(tmp_path):
    options = _options(tmp_path)
    assert "server_side_binding" not in options


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only")
def test_a_statement_run_often_is_prepared_on_the_connection():
    for _ in range(6):
        Run.objects.filter(status="pending").exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any('"approvals_run"' in sql for sql in prepared), prepared


def _migrate_under(table: str) -> None:
    """What a migration run by another process does: change a column's type."""
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("prepare_threshold", None)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute(f"ALTER TABLE {table} ALTER COLUMN name TYPE varchar(200)")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only")
@pytest.mark.django_db(transaction=True)
def test_a_read_prepared_before_a_migration_changed_its_columns_runs_again():
    table = "tn_stale_plan_probe"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, name varchar(10))")
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} VALUES (1, 'one')")
            for _ in range(6):  # prepared from the fifth run on
                cursor.execute(f"SELECT id, name FROM {table} WHERE id = %s", [1])
        _migrate_under(table)
        for _ in range(2):  # autocommit: replanned, and stays good
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT id, name FROM {table} WHERE id = %s", [1])
                assert cursor.fetchone() == (1, "one")
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE {table}")


def test_a_pooled_postgresql_checks_connections_by_their_socket(tmp_path):
    database = _database(tmp_path, DATABASE_URL=PG_URL)
    assert database["ENGINE"] == "approvals.db.postgresql"
    assert database["CONN_HEALTH_CHECKS"] is False  # the pool's round-trip check: ours instead
    assert database["CONN_MAX_AGE"] == 0 and "pool" in database["OPTIONS"]


def test_database_pool_0_keeps_djangos_backend_and_its_health_checks(tmp_path):
    database = _database(tmp_path, DATABASE_URL=PG_URL, DATABASE_POOL="0")
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert database["CONN_HEALTH_CHECKS"] is True and "pool" not in database.get("OPTIONS", {})
