"""What one statement of the decision path costs the process: Django's ORM, the app's own
statements module (approvals.domain.statements: each shape built once, values prepared by
their fields, rows read into model instances) and the same statement written by hand and sent
through the connection's cursor, alternating, in one process.

    python bench/statement_cost.py [--n 300] [--rounds 5]

It creates its own PostgreSQL database (127.0.0.1:5432, user postgres, dropped at exit),
migrates it, halts one demo run, and times statement shapes the decision path runs: reading
a run's row (whole, and two columns), a conditional UPDATE of the run (one that matches no
row: nothing changes between rounds), appending an audit event, and compiling a query
without running it. Each line: CPU ms per statement of this process (thread time) and wall
ms, the median over rounds, per form; the ORM's and the module's ratios to the hand-written
statement. PostgreSQL's own CPU is not in it. The forms differ a little: the ORM's reads add
`ORDER BY "id" LIMIT 1`; the ORM's INSERT names every column, serializes the JSON itself and
reads the key back, the cursor's names six columns and reads the key back, the module's
names every column and reads nothing back; the cursor form builds no model instance from a
row (the module's builds one, as the ORM's does).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://postgres@127.0.0.1:5432"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="statements per shape and round")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = ap.parse_args()
    db = f"bench_stmt_{secrets.token_hex(4)}"
    # A SIGTERM ends the bench through the `finally` below, which drops its database.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
    try:
        return measure(db, args)
    finally:
        # WITH (FORCE) ends this process's own connections to it, whatever state they are in.
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def measure(db: str, args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "toolnexus_web.settings",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": "bench",
            "DATABASE_URL": f"{PG}/{db}",
            "DATABASE_POOL": "0",  # one connection, held for the whole bench
            "TOOLNEXUS_LOG_LEVEL": "WARNING",
        }
    )
    for key in ("REDIS_URL", "DATABASE_PREPARED"):
        os.environ.pop(key, None)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import F
    from django.utils import timezone

    from approvals import services
    from approvals.domain import statements
    from approvals.execution.worker import Worker
    from approvals.models import Event, Run

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_superuser("bench")
    run = services.run_start(agent="demo", prompt="refund order A-1001, $250", started_by=user)
    Worker(maintenance_every=0).drain()
    run.refresh_from_db()
    assert run.status == "pending", run.status
    pk = run.pk
    columns = ", ".join(f'"{f.column}"' for f in Run._meta.concrete_fields)

    def raw(sql: str, params: list[Any], fetch: bool = True) -> Any:
        with connection.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if fetch else cur.rowcount

    # Each shape: (name, {form: the statement in that form}); a form a shape lacks is left out.
    shapes: list[tuple[str, dict[str, Any]]] = [
        (
            "a run's row, whole",
            {
                "orm": lambda: Run.objects.filter(pk=pk).first(),
                "module": lambda: statements.select(Run, {"pk": pk}),
                "raw": lambda: raw(f'SELECT {columns} FROM "approvals_run" WHERE "id" = %s', [pk]),
            },
        ),
        (
            "a run's row, two columns",
            {
                "orm": lambda: Run.objects.filter(pk=pk).values_list("status", "version").first(),
                "raw": lambda: raw(
                    'SELECT "status", "version" FROM "approvals_run" WHERE "id" = %s', [pk]
                ),
            },
        ),
        (
            "conditional UPDATE of a run (no match)",
            {
                "orm": lambda: Run.objects.filter(pk=pk, status="done").update(
                    status="queued", version=F("version") + 1, updated_at=timezone.now()
                ),
                "module": lambda: statements.update(
                    Run,
                    {"pk": pk, "status": "done"},
                    {"status": "queued", "updated_at": timezone.now()},
                    add={"version": 1},
                ),
                "raw": lambda: raw(
                    'UPDATE "approvals_run" SET "status" = %s, "updated_at" = %s,'
                    ' "version" = "version" + %s WHERE "id" = %s AND "status" = %s',
                    ["queued", timezone.now(), 1, pk, "done"],
                    fetch=False,
                ),
            },
        ),
        (
            "append an audit event",
            {
                "orm": lambda: Event.objects.create(run_id=pk, action="bench", detail={"n": 1}),
                "module": lambda: statements.insert(
                    [Event(run_id=pk, action="bench", detail={"n": 1})]
                ),
                "raw": lambda: raw(
                    'INSERT INTO "approvals_event" ("run_id", "action", "from_state", "to_state",'
                    ' "detail", "created_at") VALUES (%s, %s, %s, %s, %s::jsonb, %s)'
                    ' RETURNING "id"',
                    [pk, "bench", "", "", '{"n": 1}', timezone.now()],
                ),
            },
        ),
        (
            "compile a run's read (no statement)",
            {"orm": lambda: Run.objects.filter(pk=pk).query.sql_with_params()},
        ),
    ]
    n = args.n
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for fn in [f for _, forms in shapes for f in forms.values()]:  # warm-up
        for _ in range(20):
            fn()
    for r in range(args.rounds):
        for name, forms in shapes:
            order = list(forms.items())
            for form, fn in order if r % 2 == 0 else order[::-1]:
                c0, w0 = time.thread_time(), time.perf_counter()
                for _ in range(n):
                    fn()
                cpu = (time.thread_time() - c0) * 1000 / n
                wall = (time.perf_counter() - w0) * 1000 / n
                results.setdefault((name, form), []).append((cpu, wall))

    def med(name: str, form: str, i: int) -> float | None:
        rows = results.get((name, form))
        return statistics.median(x[i] for x in rows) if rows else None

    def cell(x: float | None, width: int) -> str:
        return f"{x:{width}.3f}" if x is not None else " " * (width - 1) + "-"

    def times(x: float | None, y: float | None) -> str:
        return f"{x / y:5.1f}x" if x is not None and y else "     -"

    print(
        f"statement cost, N = {n} per shape and round, {args.rounds} alternating rounds,"
        f" medians; PostgreSQL {connection.pg_version // 10000}, DEBUG off,"
        f" server-side binding {'on' if connection.settings_dict['OPTIONS'].get('server_side_binding') else 'off'}"
    )
    print(
        f"{'statement':40s} {'ORM cpu':>8s} {'module':>8s} {'raw cpu':>8s} {'ORM/raw':>7s}"
        f" {'mod/raw':>7s} {'ORM wall':>9s} {'mod wall':>9s} {'raw wall':>9s}"
    )
    for name, _ in shapes:
        oc, mc, rc = (med(name, form, 0) for form in ("orm", "module", "raw"))
        ow, mw, rw = (med(name, form, 1) for form in ("orm", "module", "raw"))
        print(
            f"{name:40s} {cell(oc, 8)} {cell(mc, 8)} {cell(rc, 8)} {times(oc, rc):>7s}"
            f" {times(mc, rc):>7s} {cell(ow, 9)} {cell(mw, 9)} {cell(rw, 9)}"
        )
    print(
        "(ms per statement; cpu: this process's thread time; module: approvals.domain.statements)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
