"""What a rule saves: runs completed per second when a rule approves the gated call, against
the same runs halting for a person's decision and resuming.

    python bench/rule_speed.py                     # 5 alternating rounds of 200 runs per path
    python bench/rule_speed.py --rounds 3 --runs 50

PostgreSQL only (127.0.0.1:5432 as postgres): a database of its own
(`bench_queue_aging_<hex>`, made by queue_aging.py's helper, migrated, dropped at exit; the
tests' databases are never touched), one connection held for the whole run
(`DATABASE_POOL=0`, `CONN_MAX_AGE=None`), the demo agent (its in-process model: the first
turn asks for one `refund` relay call, the next one reads the result), the worker in this
thread (`Worker.drain`).

Each round runs both paths, in alternating order, on the clock from the first `run_start`
to the last run `done`:

- `person`: N runs started, the worker drives them to their pending request, a reviewer
  approves each (`services.request_approve`, as the page and the API do), the worker resumes
  them to `done`;
- `rule`: an enabled rule approves `refund` for the demo agent; N runs started, the worker
  drives each to `done` in one step (the rule decides where the run would halt);
- `floor`: the floor under both, a run with no tool call at all (an agent of this bench whose
  model answers at once): N runs started, the worker drives each to `done`.

Per path and round: runs per second (wall), this process's CPU, the PostgreSQL backend's CPU
and the SQL statements and commits per run. The last lines: the medians over rounds of rule /
person and floor / person, in runs per second and in statements per run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from queue_aging import backend_cpu_ns, create_database, setup_django  # noqa: E402


def register_floor_agent() -> None:
    from approvals import agents
    from toolnexus import create_in_process_client

    agents.register(
        "bench_floor",
        model=lambda: create_in_process_client(
            generate=lambda request: {"content": "Nothing to do."}, model="bench-floor"
        ),
        tools=[],
        replace=True,
    )


def start(n: int, user, tag: str, agent: str = "demo") -> list:
    from approvals import services

    return [
        services.run_start(agent=agent, prompt=f"Refund order {tag}-{i:05d}, $5", started_by=user)
        for i in range(n)
    ]


def check_done(runs, path: str) -> None:
    from approvals.models import ApprovalRequest, Run

    ids = [r.pk for r in runs]
    statuses = set(Run.objects.filter(pk__in=ids).values_list("status", flat=True))
    if statuses != {"done"}:
        raise SystemExit(f"{path}: not every run ended done: {statuses}")
    by_rule = ApprovalRequest.objects.filter(run_id__in=ids, decided_by_rule__isnull=False)
    want = len(ids) if path == "rule" else 0
    if by_rule.count() != want:
        raise SystemExit(
            f"{path}: {by_rule.count()} request(s) decided by the rule, {want} expected"
        )


def person_path(n: int, user, worker, tag: str) -> list:
    from approvals import services

    runs = start(n, user, tag)
    worker.drain(max_tasks=n + 10)
    for run in runs:
        request = run.requests.get()
        services.request_approve(request_id=request.request_id, user=user)
    worker.drain(max_tasks=n + 10)
    return runs


def rule_path(n: int, user, worker, tag: str) -> list:
    runs = start(n, user, tag)
    worker.drain(max_tasks=n + 10)
    return runs


def floor_path(n: int, user, worker, tag: str) -> list:
    runs = start(n, user, tag, agent="bench_floor")
    worker.drain(max_tasks=n + 10)
    return runs


PATHS = {"person": person_path, "rule": rule_path, "floor": floor_path}


class Statements:
    """Counts the statements and commits this process sends (a connection's execute wrapper
    and its commit), whatever sends them."""

    def __init__(self) -> None:
        self.statements = self.commits = 0

    def __call__(self, execute, sql, params, many, context):
        self.statements += 1
        return execute(sql, params, many, context)


def measure(path: str, n: int, user, worker, rule, tag: str) -> dict[str, float]:
    from django.db import connection

    from approvals.models import Rule

    Rule.objects.filter(pk=rule.pk).update(enabled=path == "rule")  # outside the clock
    counter = Statements()
    commit = connection.commit

    def counted_commit():
        counter.commits += 1
        commit()

    connection.commit = counted_commit
    pg_before, py_before = backend_cpu_ns(), os.times()
    started = time.perf_counter()
    with connection.execute_wrapper(counter):
        runs = PATHS[path](n, user, worker, tag)
    wall = time.perf_counter() - started
    py_after, pg_after = os.times(), backend_cpu_ns()
    del connection.commit
    check_done(runs, path)
    py = py_after.user + py_after.system - py_before.user - py_before.system
    return {
        "runs/s": n / wall,
        "py cpu ms": py * 1000 / n,
        "pg cpu ms": (pg_after - pg_before) / 1e6 / n,
        "statements": counter.statements / n,
        "commits": counter.commits / n,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200, help="runs per path and round")
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    name = create_database()
    setup_django(name, task_autovacuum=True)
    from approvals.execution.worker import Worker
    from approvals.models import Rule
    from approvals.testing import make_user

    user = make_user(role="superuser", username="bench-reviewer")
    user.has_perm("approvals.decide_request")  # its permissions cached, as a host's user
    rule = Rule.objects.create(
        name="small refunds",
        agent="demo",
        tool="refund",
        effect=Rule.Effect.APPROVE,
        condition="args.amount <= 50",
        enabled=False,
    )
    register_floor_agent()
    worker = Worker(maintenance_every=0)
    for path in PATHS:
        if args.warmup:
            measure(path, args.warmup, user, worker, rule, f"W{path[0]}")

    print(f"rule speed on PostgreSQL ({name}): {args.rounds} rounds of {args.runs} runs per path")
    print(
        f"{'round':>5} {'path':<7} {'runs/s':>8} {'py cpu ms':>10} {'pg cpu ms':>10}"
        f" {'statements':>11} {'commits':>8}"
    )
    rounds = []
    for number in range(1, args.rounds + 1):
        order = list(PATHS) if number % 2 else list(reversed(PATHS))
        got = {}
        for path in order:
            got[path] = f = measure(path, args.runs, user, worker, rule, f"R{number}{path[0]}")
            print(
                f"{number:>5} {path:<7} {f['runs/s']:>8.1f} {f['py cpu ms']:>10.2f}"
                f" {f['pg cpu ms']:>10.3f} {f['statements']:>11.1f} {f['commits']:>8.1f}",
                flush=True,
            )
        rounds.append(got)
    for path in ("rule", "floor"):
        for figure in ("runs/s", "statements"):
            ratios = [got[path][figure] / got["person"][figure] for got in rounds]
            print(
                f"{path} / person, {figure}: median {statistics.median(ratios):.2f} "
                f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
