"""Sustained decision throughput with resumes completing, and the backlog when workers fall behind.

    python bench/throughput.py                         # 2 servers, 2 workers, 20 reviewers
    python bench/throughput.py --reviewers 40 --seconds 20 --overload-seconds 20
    python bench/throughput.py --overload-rate 60      # paced (open-loop) overload instead

It starts its own topology (bench/topology.py: a fresh PostgreSQL database, Redis db 6,
K Daphne servers, M db_worker processes, DEBUG off) and pre-creates a pool of halted demo
runs. Then:

1. SUSTAINED: N reviewers (closed loop, no think time) decide pending requests for T seconds
   with all M workers running; every other request is approved (the worker runs the refund
   executor: one ToolExecution row), the others are declined with a reason. It counts
   decisions/s accepted (HTTP 200) and runs done/s in the same window, then waits for the
   workers to finish what is left.
2. OVERLOAD: all workers but one are stopped (SIGTERM, after their current task), and the
   reviewers go on deciding faster than one worker resumes. The queue depth (ready task rows,
   runs queued) is sampled every 0.5 s and printed over time; then the load stops and the
   samples go on until the queue has drained to zero.
3. CHECKS: every decided request's run ended done; one run_resumed and one run_done event
   per run; exactly one finished ToolExecution per approved run and none per declined run;
   every task row successful; decisions accepted = requests decided (nothing dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.topology import (
    PG_HOST,
    PG_PORT,
    PG_USER,
    BenchError,
    PendingRun,
    Profiler,
    Reviewer,
    Topology,
    add_topology_args,
    config_from_args,
    create_pending_runs,
    http_client,
    percentile,
    profile_summary,
    run_benchmark,
)

REASON = "bench: declined under load"

DEPTH_SQL = """
SELECT
  (SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'READY'),
  (SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'RUNNING'),
  (SELECT count(*) FROM approvals_run WHERE status = 'queued'),
  (SELECT count(*) FROM approvals_run WHERE status = 'running'),
  (SELECT count(*) FROM approvals_run WHERE status = 'done'),
  (SELECT count(*) FROM approvals_approvalrequest WHERE state <> 'pending')
"""


@dataclass
class Sample:
    t: float  # seconds since the phase started
    ready: int
    task_running: int
    queued: int
    running: int
    done: int
    decided: int
    load_on: bool

    @property
    def backlog(self) -> int:
        return self.queued + self.running


class Sampler:
    """Queue depth every `every` seconds, from a thread with its own connection (so a slow
    query never stalls the load generator's event loop)."""

    def __init__(self, db_name: str, every: float) -> None:
        self.db_name, self.every = db_name, every
        self.samples: list[Sample] = []
        self.load_on = True
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="depth-sampler", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def _loop(self) -> None:
        import psycopg

        try:
            with psycopg.connect(
                host=PG_HOST,
                port=PG_PORT,
                user=PG_USER,
                dbname=self.db_name,
                connect_timeout=5,
                autocommit=True,
            ) as conn:
                conn.execute("SET statement_timeout = '10s'")
                next_at = time.monotonic()
                while not self._stop.is_set():
                    row = conn.execute(DEPTH_SQL).fetchone()
                    assert row is not None
                    self.samples.append(
                        Sample(round(time.monotonic() - self._t0, 2), *row, self.load_on)
                    )
                    next_at += self.every
                    self._stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None


@dataclass
class LoadResult:
    label: str
    workers: int
    reviewers: int
    seconds: float = 0.0
    accepted: int = 0
    approved: int = 0
    declined: int = 0
    errors: list[str] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    exhausted: bool = False
    done_in_window: int = 0
    done_rate: float = 0.0
    backlog_at_stop: int = 0
    drain_seconds: float = 0.0
    drained: bool = False
    drain_rate: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    profiles: list[tuple[str, Path]] = field(default_factory=list)


class Load:
    def __init__(self, topo: Topology, reviewers: list[Reviewer], args) -> None:
        self.topo = topo
        self.reviewers = reviewers
        self.args = args
        self.clients = []
        self.approved_runs: set[int] = set()
        self.declined_runs: set[int] = set()
        self.count = 0

    async def open(self) -> None:
        conc = self.args.reviewers + 8
        self.clients = [http_client(f"http://127.0.0.1:{s.port}", conc) for s in self.topo.servers]

    async def close(self) -> None:
        for c in self.clients:
            await c.aclose()

    async def decide(self, j: int, item: PendingRun, result: LoadResult) -> None:
        reviewer = self.reviewers[j % len(self.reviewers)]
        client = self.clients[j % len(self.clients)]
        approve = self.count % 2 == 0
        self.count += 1
        path = f"/api/requests/{item.request_id}/{'approve' if approve else 'decline'}"
        body = {} if approve else {"reason": REASON}
        t0 = time.perf_counter()
        try:
            r = await client.post(
                path, json=body, headers={"Authorization": f"Bearer {reviewer.token}"}
            )
        except Exception as exc:
            result.errors.append(f"{path}: {type(exc).__name__}: {exc}")
            return
        result.latency_ms.append((time.perf_counter() - t0) * 1000)
        if r.status_code != 200:
            result.errors.append(f"{path}: {r.status_code} {r.text[:200]}")
            return
        result.accepted += 1
        if approve:
            result.approved += 1
            self.approved_runs.add(item.run_id)
        else:
            result.declined += 1
            self.declined_runs.add(item.run_id)

    async def closed_loop(
        self, pool: collections.deque[PendingRun], seconds: float, result: LoadResult
    ) -> None:
        """N reviewers, each deciding the next pending request as soon as its last POST returns."""
        deadline = time.perf_counter() + seconds

        async def reviewer(j: int) -> None:
            while time.perf_counter() < deadline:
                if not pool:
                    result.exhausted = True
                    return
                await self.decide(j, pool.popleft(), result)

        await asyncio.gather(*(reviewer(j) for j in range(self.args.reviewers)))

    async def paced(
        self, pool: collections.deque[PendingRun], seconds: float, rate: float, result: LoadResult
    ) -> None:
        """Open loop: one decision every 1/rate s, whatever the server's pace (bounded)."""
        deadline = time.perf_counter() + seconds
        sem = asyncio.Semaphore(self.args.reviewers * 4)
        tasks: list[asyncio.Task[None]] = []
        next_at = time.perf_counter()
        j = 0

        async def one(j: int, item: PendingRun) -> None:
            try:
                await self.decide(j, item, result)
            finally:
                sem.release()

        while time.perf_counter() < deadline:
            if not pool:
                result.exhausted = True
                break
            await sem.acquire()
            tasks.append(asyncio.get_running_loop().create_task(one(j, pool.popleft())))
            j += 1
            next_at += 1.0 / rate
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.gather(*tasks)


async def run_phase(
    load: Load,
    topo: Topology,
    pool: collections.deque[PendingRun],
    *,
    label: str,
    seconds: float,
    rate: float | None,
    args,
) -> LoadResult:
    result = LoadResult(label, len(topo.workers), args.reviewers)
    spy = Profiler(topo, args.profile, label) if args.profile else None
    if spy is not None:
        spy.start()
        await asyncio.sleep(0.5)  # py-spy attaches
    sampler = Sampler(topo.cfg.db_name, args.sample_every)
    sampler.start()
    await asyncio.sleep(args.sample_every * 1.5)  # a first sample before the load
    if sampler.error is not None:
        raise BenchError(f"queue sampler failed: {sampler.error}")
    first = sampler.latest()
    t0 = time.perf_counter()
    if rate:
        await load.paced(pool, seconds, rate, result)
    else:
        await load.closed_loop(pool, seconds, result)
    result.seconds = time.perf_counter() - t0
    sampler.load_on = False
    await asyncio.sleep(args.sample_every * 1.5)
    stop_sample = sampler.latest()
    t_stop = time.monotonic()
    # Let the workers finish: until nothing is queued or running and no task row is ready.
    deadline = t_stop + args.drain_timeout
    while time.monotonic() < deadline:
        if sampler.error is not None:
            break
        s = sampler.latest()
        if s is not None and s.ready == 0 and s.task_running == 0 and s.backlog == 0:
            result.drained = True
            break
        topo.check_alive()
        await asyncio.sleep(args.sample_every)
    result.drain_seconds = time.monotonic() - t_stop
    sampler.stop()
    if spy is not None:
        result.profiles = spy.stop()
    if sampler.error is not None:
        raise BenchError(f"queue sampler failed: {sampler.error}")
    last = sampler.latest()
    result.samples = sampler.samples
    if first is not None and stop_sample is not None and stop_sample.t > first.t:
        result.done_in_window = stop_sample.done - first.done
        result.done_rate = result.done_in_window / (stop_sample.t - first.t)
        result.backlog_at_stop = stop_sample.backlog
    if last is not None and stop_sample is not None and result.drain_seconds > 0:
        drained = last.done - stop_sample.done
        result.drain_rate = drained / result.drain_seconds if drained else 0.0
    return result


def print_timeline(result: LoadResult, every: int) -> None:
    print()
    print(
        f"queue depth over time, {result.label} ({result.workers} worker(s)); "
        "backlog = runs queued + running"
    )
    head = (
        f"{'t s':>6} {'load':<4} {'decided':>8} {'ready tasks':>11} {'queued':>7} "
        f"{'running':>7} {'done':>6}  backlog"
    )
    print(head)
    print("-" * len(head))
    peak = max((s.backlog for s in result.samples), default=0) or 1
    base_decided = result.samples[0].decided if result.samples else 0
    base_done = result.samples[0].done if result.samples else 0
    shown = result.samples[::every]
    if result.samples and shown[-1] is not result.samples[-1]:
        shown.append(result.samples[-1])
    for s in shown:
        bar = "#" * max(0, round(40 * s.backlog / peak))
        print(
            f"{s.t:6.1f} {'on' if s.load_on else 'off':<4} {s.decided - base_decided:>8} "
            f"{s.ready:>11} {s.queued:>7} {s.running:>7} {s.done - base_done:>6}  {bar}"
        )


def checks(topo: Topology, load: Load, results: list[LoadResult]) -> list[tuple[str, bool, str]]:
    out: list[tuple[str, bool, str]] = []
    approved, declined = sorted(load.approved_runs), sorted(load.declined_runs)
    decided = approved + declined
    accepted = sum(r.accepted for r in results)

    rows = topo.sql(
        "SELECT state, count(*) FROM approvals_approvalrequest WHERE run_id = ANY(%s) GROUP BY state",
        (decided,),
    )
    states = dict(rows)
    n_decided = states.get("approved", 0) + states.get("declined", 0)
    out.append(
        (
            "decisions accepted (HTTP 200) = requests stored as decided",
            accepted == n_decided == len(decided) and not states.get("pending"),
            f"{accepted} accepted, {n_decided} stored ({states})",
        )
    )
    status = dict(
        topo.sql(
            "SELECT status, count(*) FROM approvals_run WHERE id = ANY(%s) GROUP BY status",
            (decided,),
        )
    )
    out.append(
        (
            "every decided request's run ended done",
            status.get("done", 0) == len(decided) and len(status) <= 1,
            f"{status}",
        )
    )
    for action in ("run_resumed", "run_done"):
        bad = topo.sql(
            "SELECT count(*) FROM (SELECT r.id, count(e.id) AS n FROM approvals_run r "
            "LEFT JOIN approvals_event e ON e.run_id = r.id AND e.action = %s "
            "WHERE r.id = ANY(%s) GROUP BY r.id) x WHERE n <> 1",
            (action, decided),
        )[0][0]
        out.append(
            (
                f"exactly one {action} event per decided run",
                bad == 0,
                f"{bad} run(s) with a count other than 1",
            )
        )
    claims = topo.sql(
        "SELECT count(*) FROM approvals_event WHERE action = 'run_taken_over' AND run_id = ANY(%s)",
        (decided,),
    )[0][0]
    out.append(("no run taken over from a worker (no lease lapsed)", claims == 0, f"{claims}"))
    bad_exec = topo.sql(
        "SELECT count(*) FROM (SELECT r.id, count(t.id) AS n, count(t.finished_at) AS f "
        "FROM approvals_run r LEFT JOIN approvals_toolexecution t ON t.run_id = r.id "
        "WHERE r.id = ANY(%s) GROUP BY r.id) x WHERE n <> 1 OR f <> 1",
        (approved,),
    )[0][0]
    out.append(
        (
            "approved runs: exactly one finished ToolExecution (refund ran once)",
            bad_exec == 0,
            f"{len(approved)} approved, {bad_exec} with a count other than 1",
        )
    )
    extra = topo.sql(
        "SELECT count(*) FROM approvals_toolexecution WHERE run_id = ANY(%s)", (declined,)
    )[0][0]
    out.append(
        (
            "declined runs: no ToolExecution (refund never ran)",
            extra == 0,
            f"{len(declined)} declined, {extra} execution row(s)",
        )
    )
    tasks = dict(
        topo.sql("SELECT status, count(*) FROM django_tasks_database_dbtaskresult GROUP BY status")
    )
    out.append(
        (
            "no task row left (a finished one is removed; none ready, running or failed)",
            not tasks,
            f"{tasks}",
        )
    )
    texts = topo.sql(
        "SELECT count(*) FROM approvals_run WHERE id = ANY(%s) AND text NOT LIKE %s",
        (declined, "%reviewer declined it (bench: declined under load)%"),
    )[0][0]
    out.append(
        (
            "declined runs: the model read the reason",
            texts == 0,
            f"{texts} run(s) whose final text lacks the reason",
        )
    )
    return out


async def main_async(args, topo: Topology) -> int:
    reviewers = topo.setup_users(args.reviewers)
    pool = collections.deque(await create_pending_runs(topo, reviewers[0].token, args.runs))
    load = Load(topo, reviewers, args)
    await load.open()
    results: list[LoadResult] = []
    try:
        keep_for_overload = 0 if args.overload_seconds <= 0 else args.overload_runs
        sustained_pool = collections.deque(
            pool.popleft() for _ in range(max(0, len(pool) - keep_for_overload))
        )
        how = f"paced at {args.rate}/s" if args.rate else "closed loop"
        print(
            f"sustained: {args.reviewers} reviewers ({how}), {len(topo.workers)} worker(s), "
            f"{args.seconds:.0f} s (pool {len(sustained_pool)})",
            flush=True,
        )
        res = await run_phase(
            load,
            topo,
            sustained_pool,
            label="sustained",
            seconds=args.seconds,
            rate=args.rate,
            args=args,
        )
        results.append(res)
        pool.extend(sustained_pool)  # what the sustained phase left goes to the overload phase
        if args.overload_seconds > 0:
            if len(topo.workers) > 1:
                print(f"stopping {len(topo.workers) - 1} worker(s): one is left", flush=True)
                topo.stop_workers(keep=1)
            how = f"paced at {args.overload_rate}/s" if args.overload_rate else "closed loop"
            print(
                f"overload: {args.reviewers} reviewers ({how}), 1 worker, "
                f"{args.overload_seconds:.0f} s (pool {len(pool)})",
                flush=True,
            )
            res = await run_phase(
                load,
                topo,
                pool,
                label="overload",
                seconds=args.overload_seconds,
                rate=args.overload_rate,
                args=args,
            )
            results.append(res)
    finally:
        await load.close()

    print()
    print(
        f"Throughput: {len(topo.servers)} Daphne server(s), PostgreSQL + Redis on loopback, "
        f"DEBUG off, pool {'off' if args.no_pool else 'on'}, "
        f"prepared statements {'off' if args.no_prepared else 'on'}, worker poll {args.worker_interval} s; "
        "half the decisions approve (refund executor runs), half decline."
    )
    head = (
        f"{'phase':<10} {'workers':>7} {'reviewers':>9} {'load s':>7} {'decisions':>9} "
        f"{'decided/s':>9} {'done/s':>7} {'POST p50':>8} {'POST p99':>8} {'backlog@stop':>12} "
        f"{'drain s':>7} {'drain/s':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r.label:<10} {r.workers:>7} {r.reviewers:>9} {r.seconds:>7.1f} {r.accepted:>9} "
            f"{r.accepted / r.seconds:>9.1f} {r.done_rate:>7.1f} "
            f"{percentile(r.latency_ms, 0.5):>8.1f} {percentile(r.latency_ms, 0.99):>8.1f} "
            f"{r.backlog_at_stop:>12} {r.drain_seconds:>7.1f} {r.drain_rate:>7.1f}"
            + ("" if r.drained else "  NOT DRAINED")
            + ("  (pool ran out)" if r.exhausted else "")
        )
    first = results[0]
    print(
        f"sustainable with resumes completing ({first.workers} worker(s)): about "
        f"{min(first.accepted / first.seconds, first.done_rate):.1f} decisions/s "
        f"(the smaller of decided/s and done/s under load; with no HTTP load the workers "
        f"drained {first.drain_rate:.1f} runs/s)"
    )
    for r in results:
        if r.errors:
            print(f"{r.label}: {len(r.errors)} failed decision(s), e.g. {r.errors[0]}")

    for r in results:
        print_timeline(
            r, every=1 if r.label == "overload" else max(1, round(2 / args.sample_every))
        )

    for r in results:
        if r.profiles:
            print()
            print(f"py-spy, {r.label} phase (load and drain), raw files in {args.profile}:")
            for name, path in r.profiles:
                print(f"  -- {name}: " + "\n     ".join(profile_summary(path)))

    print()
    verdicts = checks(topo, load, results)
    drained = all(r.drained for r in results)
    verdicts.insert(0, ("the queue drained to zero after each phase", drained, ""))
    problems = topo.log_problems()
    verdicts.append(
        (
            "no errors in the processes' logs",
            not problems,
            f"{len(problems)} line(s), e.g. {problems[0]}" if problems else "",
        )
    )
    for name, ok, detail in verdicts:
        print(f"{'OK    ' if ok else 'FAILED'}  {name}{':  ' + detail if detail else ''}")
    return 0 if all(ok for _, ok, _ in verdicts) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reviewers", type=int, default=20, help="concurrent reviewers (default 20)")
    ap.add_argument("--seconds", type=float, default=10, help="sustained phase length (s)")
    ap.add_argument(
        "--rate",
        type=float,
        default=None,
        help="sustained phase: decisions/s, paced (default: closed loop)",
    )
    ap.add_argument("--overload-seconds", type=float, default=10, help="0 skips the overload phase")
    ap.add_argument(
        "--overload-rate",
        type=float,
        default=None,
        help="decisions/s, paced (default: closed loop, as fast as the reviewers go)",
    )
    ap.add_argument("--runs", type=int, default=600, help="halted runs created up front")
    ap.add_argument(
        "--overload-runs", type=int, default=200, help="of those, kept for the overload phase"
    )
    ap.add_argument("--sample-every", type=float, default=0.5, help="queue sampling period (s)")
    ap.add_argument("--drain-timeout", type=float, default=180, help="max wait for a drain (s)")
    ap.add_argument("--profile", type=Path, help="py-spy every process in each phase (dir)")
    add_topology_args(
        ap,
        db_name="toolnexus_bench_throughput",
        redis_db=6,
        workers_help="db_worker processes, sustained phase",
    )
    args = ap.parse_args(argv)
    if args.reviewers < 1 or args.seconds <= 0 or args.runs < 10:
        ap.error("--reviewers >= 1, --seconds > 0 and --runs >= 10 please")
    if args.overload_seconds > 0 and args.overload_runs >= args.runs:
        ap.error("--overload-runs must be smaller than --runs")
    return run_benchmark(config_from_args(args), lambda topo: main_async(args, topo))


if __name__ == "__main__":
    sys.exit(main())
