"""Queue aging: does a resume cost PostgreSQL more as the system ages?

    python bench/queue_aging.py                    # 10 rounds of 300 resumes (~3-5 minutes)
    python bench/queue_aging.py --rounds 4 --resumes 100

django-tasks-db's claim query looks for a READY task row. Finished rows that stay in the
table, and the dead versions every claim and finish leave behind until a VACUUM, can make
that query walk more each time. This bench creates a database of its own
(`bench_queue_aging_<hex>` on 127.0.0.1:5432 as postgres, migrated, dropped at exit) with
autovacuum off for the task table, so nothing cleans up behind the app's back, and then, per
round, outside the clock: starts `--resumes` demo runs and drives them to their pending
request, and approves each; inside the clock: the worker (`Worker.drain`, in this thread, on
one connection held for the whole run) resumes them all to `done`.

Per round it prints, per resume:

- `pg cpu ms`: the CPU of the PostgreSQL backend serving the bench's connection while the
  resumes run (`/proc/<backend pid>/schedstat`, nanoseconds), divided by the resumes;
- `py cpu ms`: this process's CPU (`os.times`, user + system) over the same span;
- `claim buffers`: the buffers (shared hit + read) the worker's claim query touches when
  the queue holds nothing ready (`EXPLAIN (ANALYZE, BUFFERS)` of the stock worker's query,
  run after the round), and `task rows`: the rows in the task table then (live ones).

The last round's `pg cpu ms` is compared with the first's. The first round starts on a new
backend whose catalog caches are cold: `--warmup` resumes run before round 1, unmeasured.
"""

from __future__ import annotations

import argparse
import atexit
import os
import statistics
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVER = "postgres://postgres@127.0.0.1:5432"


def create_database() -> str:
    name = f"bench_queue_aging_{uuid.uuid4().hex[:8]}"
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", name], check=True)

    def drop() -> None:
        from django.db import connections

        connections.close_all()
        subprocess.run(
            ["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", "--force", name],
            check=False,
        )

    atexit.register(drop)
    return name


def setup_django(name: str, *, task_autovacuum: bool = False) -> None:
    """Django on database `name`, migrated, one connection kept; autovacuum off for the task
    table unless `task_autovacuum` (this bench's point is the table aging unvacuumed)."""
    os.environ["DATABASE_URL"] = f"{SERVER}/{name}"
    os.environ["DATABASE_POOL"] = "0"  # one connection, one backend to read the CPU of
    os.environ.pop("REDIS_URL", None)  # the in-memory channel layer
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolnexus_web.settings")
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench")
    os.environ["TOOLNEXUS_DEMO_AGENT"] = "1"
    import django

    warnings.filterwarnings("ignore", message="No directory at")
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.DATABASES["default"]["CONN_MAX_AGE"] = None  # kept between tasks
    call_command("migrate", verbosity=0)
    if task_autovacuum:
        return
    from django.db import connection
    from django_tasks_db.models import DBTaskResult

    with connection.cursor() as cursor:
        cursor.execute(
            f'ALTER TABLE "{DBTaskResult._meta.db_table}" SET (autovacuum_enabled = false)'
        )


def backend_cpu_ns() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def claim_buffers() -> tuple[int, int]:
    """Buffers the stock worker's claim query touches now, and the task rows there are."""
    from django.db import connection, transaction
    from django_tasks_db.models import DBTaskResult

    tasks = (
        DBTaskResult.objects.ready()
        .filter(backend_name="default", queue_name__in=["default"])
        .select_for_update(skip_locked=True)[:1]
    )
    with transaction.atomic(), connection.cursor() as cursor:
        sql, params = tasks.query.sql_with_params()
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        (plan,) = cursor.fetchone()
    top = (plan[0] if isinstance(plan, list) else plan)["Plan"]
    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    return buffers, DBTaskResult.objects.count()


def halt_and_approve(n: int, user) -> list:
    from approvals import services
    from approvals.testing import drain

    runs = [
        services.run_start(agent="demo", prompt=f"Refund order A-{i:05d}, $5", started_by=user)
        for i in range(n)
    ]
    drain()
    for run in runs:
        request = run.requests.get()
        services.request_approve(request_id=request.request_id, user=user)
    return runs


def check_done(runs) -> None:
    from approvals.models import Run

    statuses = set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True))
    if statuses != {"done"}:
        raise SystemExit(f"not every run ended done: {statuses}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--resumes", type=int, default=300, help="resumes per round")
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    name = create_database()
    setup_django(name)
    from approvals.execution.worker import Worker
    from tests.approvals.factories import make_user

    user = make_user(role="reviewer", username="bench-reviewer")
    user.has_perm("approvals.decide_request")  # its permissions cached, as a host's user
    worker = Worker(maintenance_every=0)
    if args.warmup:
        warm = halt_and_approve(args.warmup, user)
        worker.drain()
        check_done(warm)

    print(f"queue aging on PostgreSQL ({name}), autovacuum off for the task table")
    print(f"{args.rounds} rounds of {args.resumes} resumes, after {args.warmup} warm-up ones")
    print(
        f"{'round':>5} {'pg cpu ms':>10} {'py cpu ms':>10} {'claim buffers':>14} {'task rows':>10}"
    )
    figures = []
    for number in range(1, args.rounds + 1):
        runs = halt_and_approve(args.resumes, user)
        pg_before, py_before = backend_cpu_ns(), os.times()
        started = time.perf_counter()
        ran = worker.drain(max_tasks=args.resumes + 10)
        wall = time.perf_counter() - started
        py_after, pg_after = os.times(), backend_cpu_ns()
        if ran != args.resumes:
            raise SystemExit(f"round {number}: {ran} tasks ran, {args.resumes} expected")
        check_done(runs)
        pg_ms = (pg_after - pg_before) / 1e6 / args.resumes
        py_ms = (
            (py_after.user + py_after.system - py_before.user - py_before.system)
            * 1000
            / args.resumes
        )
        buffers, rows = claim_buffers()
        figures.append(pg_ms)
        print(
            f"{number:>5} {pg_ms:>10.3f} {py_ms:>10.2f} {buffers:>14} {rows:>10}"
            f"   ({wall / args.resumes * 1000:.1f} ms wall per resume)",
            flush=True,
        )
    first, last = figures[0], figures[-1]
    print(
        f"PostgreSQL CPU per resume: last round / first = {last / first:.3f}; "
        f"median of rounds {statistics.median(figures):.3f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
