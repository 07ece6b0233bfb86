"""Inbox scale: time and query count to render the first inbox page as pending requests grow.

    python bench/inbox_scale.py                       # SQLite (a temp file)
    python bench/inbox_scale.py --postgres            # PostgreSQL on 127.0.0.1 (database toolnexus_bench)
    python bench/inbox_scale.py --sizes 1000,10000,100000 --repeat 50

For each size it fills a fresh database with that many pending requests (each with its run
and one relay call, spread over three agents), then renders the reviewer's first inbox page
(GET / through Django's full stack: middleware, view, selectors, template) and the JSON
API's first page (GET /api/requests), `--repeat` times after warm-up, and prints p50/p95 and
the number of SQL queries per render. The query count must not grow with the row count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def setup_database(postgres: bool) -> str:
    if postgres:
        url = os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/toolnexus_bench"
        )
        name = url.rsplit("/", 1)[1]
        admin = url.rsplit("/", 1)[0] + "/postgres"
        subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {name}"], check=True)
        subprocess.run(["psql", admin, "-qc", f"CREATE DATABASE {name}"], check=True)
        os.environ["DATABASE_URL"] = url
        return f"PostgreSQL ({name})"
    path = Path(tempfile.mkdtemp()) / "inbox-bench.sqlite3"
    os.environ.pop("DATABASE_URL", None)
    os.environ["TOOLNEXUS_SQLITE_PATH"] = str(path)
    return f"SQLite ({path})"


def fill(target: int) -> None:
    """Grow the pending backlog to `target` requests (bulk inserts, 5k rows a batch)."""
    from django.db import transaction

    from approvals.models import ApprovalRequest, RequestCall, Run

    have = ApprovalRequest.objects.count()
    batch = 5000
    while have < target:
        n = min(batch, target - have)
        with transaction.atomic():
            runs = Run.objects.bulk_create(
                [
                    Run(
                        agent=f"agent{(have + i) % 3}",
                        prompt=f"Refund order A-{have + i}",
                        status="pending",
                    )
                    for i in range(n)
                ]
            )
            requests = ApprovalRequest.objects.bulk_create(
                [
                    ApprovalRequest(
                        run=run,
                        agent=run.agent,
                        request_id=f"bench-{have + i}",
                        kind="tool_call",
                        prompt="relay tool call refund to the caller for execution",
                        data={
                            "calls": [
                                {
                                    "id": f"c{have + i}",
                                    "name": "refund",
                                    "input": {"order": f"A-{have + i}", "amount": 25},
                                    "arguments": "{}",
                                }
                            ]
                        },
                    )
                    for i, run in enumerate(runs)
                ]
            )
            RequestCall.objects.bulk_create(
                [
                    RequestCall(
                        request=req,
                        position=0,
                        call_id=f"c{have + i}",
                        tool_name="refund",
                        input={"order": f"A-{have + i}", "amount": 25},
                    )
                    for i, req in enumerate(requests)
                ]
            )
        have += n


def measure(client, path: str, repeat: int) -> tuple[list[float], int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(3):
        assert client.get(path).status_code == 200
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200
    with CaptureQueriesContext(connection) as queries:
        client.get(path)
    return times, len(queries)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--postgres", action="store_true", help="use PostgreSQL on 127.0.0.1 instead of SQLite"
    )
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    where = setup_database(args.postgres)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolnexus_web.settings")
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "0")  # plain HTTP on loopback
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench")
    os.environ["TOOLNEXUS_DEMO_AGENT"] = "1"
    import django

    warnings.filterwarnings("ignore", message="No directory at")  # no collectstatic here
    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    settings.ALLOWED_HOSTS = ["testserver"]
    settings.STORAGES["staticfiles"]["BACKEND"] = (
        "django.contrib.staticfiles.storage.StaticFilesStorage"
    )
    call_command("migrate", verbosity=0)
    from tests.approvals.factories import make_user

    user = make_user(role="reviewer", username="bench-reviewer")
    client = Client()
    client.force_login(user)

    print(f"inbox scale on {where}; {args.repeat} renders per size after 3 warm-ups")
    print(f"{'pending':>8}  {'page':<16} {'p50 ms':>8} {'p95 ms':>8} {'queries':>8}")
    for size in [int(s) for s in args.sizes.split(",")]:
        started = time.perf_counter()
        fill(size)
        if args.postgres:
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        filled = time.perf_counter() - started
        for label, path in (("inbox (HTML)", "/"), ("API first page", "/api/requests?limit=20")):
            times, queries = measure(client, path, args.repeat)
            print(
                f"{size:>8}  {label:<16} {statistics.median(times):>8.2f} {percentile(times, 0.95):>8.2f} {queries:>8}"
            )
        print(f"{'':>8}  (filled in {filled:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
