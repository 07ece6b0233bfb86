"""Decision latency on a production-like topology, side by side with a bare-Django floor.

    python bench/decision_latency.py                        # R = 1, 10, 50; 2 rounds
    python bench/decision_latency.py --reviewers 50 --samples 200 --rounds 3
    python bench/decision_latency.py --profile /tmp/prof    # py-spy on every process at max R

It starts its own topology (bench/topology.py: a fresh PostgreSQL database, Redis db 5,
K Daphne servers, M db_worker processes, DEBUG off), pre-creates enough halted demo runs
(POST /api/runs, then waits until each is pending), and lets R reviewers decline DISTINCT
pending requests concurrently. Per decision it measures

  (a) POST /api/requests/{id}/decline -> the HTTP response,
  (b) the same POST -> the websocket frame deleting the row (`id="row-<pk>"`,
      hx-swap-oob="delete") reaching ANOTHER reviewer connected to /ws/inbox/ on a
      different server process,
  (c) the same POST -> the resumed run's body with status done on /ws/runs/<id>/.

The FLOOR (bench/floor_urls.py: one row UPDATE + one group_send, through the same servers,
middleware and consumer) is measured the same way for (a) and (b) in the same run; the
two alternate within every round. See bench/README.md for the columns and caveats.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

try:
    from websockets.exceptions import WebSocketException
except ImportError:  # main() says how to install it
    WebSocketException = OSError  # type: ignore[misc,assignment]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench.topology import (
    BenchError,
    CpuMeter,
    LoopLag,
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
    require_websockets,
    run_benchmark,
    ws_connect,
)

# The inbox drops a decided request's row (`row-<pk>`; before the triage list, its card).
DELETE_RE = re.compile(r'id="(?:row|request)-(\d+)" hx-swap-oob="delete"')
REASON = "bench: amount exceeds refund policy"
GOAL_B_P99_MS = 100.0
GOAL_A_RATIO = 2.0
FALLBACK_OBSERVER_PATH = "/ws/inbox/?agent=demo"

# Bulk-creates the floor's pending requests (a run + a request each, as the app stores them),
# so the floor needs no worker time. Parameters as JSON on stdin.
FLOOR_ROWS = """
import json, sys
from django.db import transaction
from approvals.models import ApprovalRequest, Run
n = json.loads(sys.stdin.read())["n"]
with transaction.atomic():
    runs = Run.objects.bulk_create(
        [Run(agent="demo", prompt=f"floor {i}", status="pending") for i in range(n)]
    )
    rows = ApprovalRequest.objects.bulk_create(
        [
            ApprovalRequest(run=run, agent="demo", request_id=f"floor-{i}", kind="tool_call",
                            prompt="relay tool call refund to the caller for execution")
            for i, run in enumerate(runs)
        ]
    )
print("BENCH-FLOOR " + json.dumps([r.pk for r in rows]))
"""


def _retrieve(fut: asyncio.Future) -> None:
    """Mark a future's exception as seen (it is raised where the future is awaited, if it is)."""
    if not fut.cancelled():
        fut.exception()


class Observer:
    """A reviewer's inbox websocket on one server; timestamps every card-delete frame."""

    def __init__(self, index: int, port: int, session: str, path: str) -> None:
        self.index, self.port, self.session, self.path = index, port, session, path
        self.arrivals: dict[int, float] = {}
        self.waiters: dict[int, asyncio.Future[float]] = {}
        self.closed: BaseException | None = None
        self.frames = 0
        self._cm = None
        self._ws = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.closed = None
        self._cm = ws_connect(self.port, self.path, self.session)
        self._ws = await self._cm.__aenter__()
        await asyncio.wait_for(self._ws.recv(), 15)  # the snapshot
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for msg in self._ws:
                now = time.perf_counter()
                self.frames += 1
                text = msg if isinstance(msg, str) else msg.decode(errors="replace")
                for m in DELETE_RE.finditer(text):
                    pk = int(m.group(1))
                    self.arrivals.setdefault(pk, now)
                    fut = self.waiters.pop(pk, None)
                    if fut is not None and not fut.done():
                        fut.set_result(now)
            self.closed = ConnectionError("observer websocket closed by the server")
        except Exception as exc:
            self.closed = exc
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"observer {self.index} closed: {self.closed}"))

    def expect(self, pk: int) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)
        if pk in self.arrivals:
            fut.set_result(self.arrivals[pk])
        elif self.closed is not None:
            fut.set_exception(ConnectionError(f"observer {self.index} closed: {self.closed}"))
        else:
            self.waiters[pk] = fut
        return fut

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._cm is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._cm.__aexit__(None, None, None), 5)
        self._cm = self._ws = self._task = None


@dataclass
class Phase:
    variant: str  # "ours" | "floor"
    reviewers: int
    round: int
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    c: list[float] = field(default_factory=list)
    seconds: float = 0.0
    lag: list[float] = field(default_factory=list)
    events: list[tuple[int, float, float, float]] = field(default_factory=list)  # pk, t0, ta, tb
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per part of the topology
    audience_sockets: int = 0
    audience_missed: int = 0  # (socket, decision) pairs whose card-drop frame never came


class Bench:
    def __init__(self, topo: Topology, reviewers: list[Reviewer], observer: Reviewer, args):
        self.topo = topo
        self.reviewers = reviewers
        self.observer_user = observer
        self.args = args
        self.k = len(topo.servers)
        self.clients = []
        self.observers: list[Observer] = []
        self.notes: list[str] = []
        self.ws_failures: list[str] = []

    async def open(self, observer_path: str) -> None:
        conc = max(self.args.reviewers_list) + 4
        self.clients = [http_client(f"http://127.0.0.1:{s.port}", conc) for s in self.topo.servers]
        await self.open_observers(observer_path)

    async def open_observers(self, path: str) -> None:
        for o in self.observers:
            await o.stop()
        self.observers = [
            Observer(i, s.port, self.observer_user.session, path)
            for i, s in enumerate(self.topo.servers)
        ]
        for o in self.observers:
            try:
                await o.start()
            except (OSError, TimeoutError, WebSocketException) as exc:
                raise BenchError(
                    f"the inbox observer could not connect to server {o.index} ({path}): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc

    async def close(self) -> None:
        for o in self.observers:
            await o.stop()
        for c in self.clients:
            await c.aclose()

    def other(self, server: int) -> int:
        return (server + 1) % self.k

    # -- one decision each way -------------------------------------------------------------

    async def open_run_socket(self, port: int, path: str, session: str):
        """The run page's websocket, after its first frame; retried (and counted) when the
        handshake fails: Daphne drops a websocket whose consumer has not accepted within 5 s."""
        last: BaseException | None = None
        for _ in range(3):
            ws = None
            try:
                ws = await ws_connect(port, path, session)
                await asyncio.wait_for(ws.recv(), 15)  # the run's current body
                return ws
            except (OSError, TimeoutError, WebSocketException) as exc:
                last = exc
                self.ws_failures.append(f"{path}: {type(exc).__name__}: {exc}")
                if ws is not None:
                    with contextlib.suppress(Exception):
                        await ws.close()
        raise BenchError(f"could not open {path} in 3 attempts: {last}")

    async def decide_ours(self, reviewer: Reviewer, item: PendingRun, server: int):
        other = self.other(server)
        loop = asyncio.get_running_loop()
        path = f"/ws/runs/{item.run_id}/"
        rws = await self.open_run_socket(self.topo.servers[other].port, path, reviewer.session)
        done: asyncio.Future[float] = loop.create_future()
        done.add_done_callback(_retrieve)

        async def watch() -> None:
            try:
                async for msg in rws:
                    if "status-done" in msg:
                        done.set_result(time.perf_counter())
                        return
                    if "status-failed" in msg or "status-incomplete" in msg:
                        raise BenchError(f"run {item.run_id} did not end done: {msg[:300]}")
                raise BenchError(f"run socket for {item.run_id} closed before done")
            except Exception as exc:
                if not done.done():
                    done.set_exception(exc)

        watcher = loop.create_task(watch())
        try:
            seen = self.observers[other].expect(item.request_pk)
            t0 = time.perf_counter()
            r = await self.clients[server].post(
                f"/api/requests/{item.request_id}/decline",
                json={"reason": REASON},
                headers={"Authorization": f"Bearer {reviewer.token}"},
            )
            ta = time.perf_counter()
            if r.status_code != 200:
                raise BenchError(f"decline {item.request_id}: {r.status_code} {r.text[:300]}")
            try:
                tc = await asyncio.wait_for(done, self.args.timeout)
            except TimeoutError:
                raise BenchError(
                    f"run {item.run_id} not done {self.args.timeout} s after its decision"
                ) from None
        finally:
            watcher.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(rws.close(), 5)
        tb = await self._seen(seen, item.request_pk)
        return item.request_pk, t0, ta, tb, tc

    async def decide_floor(self, reviewer: Reviewer, pk: int, server: int):
        seen = self.observers[self.other(server)].expect(pk)
        t0 = time.perf_counter()
        r = await self.clients[server].post(
            f"/bench/floor/decline/{pk}",
            json={"reason": REASON},
            headers={"Authorization": f"Bearer {reviewer.token}"},
        )
        ta = time.perf_counter()
        if r.status_code != 200 or r.json().get("updated") != 1:
            raise BenchError(f"floor decline {pk}: {r.status_code} {r.text[:300]}")
        tb = await self._seen(seen, pk)
        return pk, t0, ta, tb, None

    async def _seen(self, fut: asyncio.Future[float], pk: int) -> float:
        try:
            return await asyncio.wait_for(fut, self.args.timeout)
        except TimeoutError:
            raise BenchError(
                f"no inbox frame deleting request-{pk} within {self.args.timeout} s"
            ) from None

    # -- one phase: R reviewers, each deciding its own items one after the other -------------

    async def open_audience(self, r: int) -> list[Observer]:
        """Every deciding reviewer's own inbox, open on its server: each decision fans out to
        all of them, as it would for a team with the inbox open."""
        audience = [
            Observer(
                100 + j, self.topo.servers[j % self.k].port, self.reviewers[j].session, "/ws/inbox/"
            )
            for j in range(r)
        ]
        for o in audience:
            try:
                await o.start()
            except (OSError, TimeoutError, WebSocketException) as exc:
                raise BenchError(
                    f"reviewer {o.index - 100}'s inbox could not connect: {exc}"
                ) from exc
        return audience

    async def phase(self, variant: str, r: int, rnd: int, items: list) -> Phase:
        per = len(items) // r
        result = Phase(variant, r, rnd)
        lag = LoopLag()
        rng = random.Random(f"{variant}-{r}-{rnd}")
        audience = await self.open_audience(r) if self.args.audience else []

        async def reviewer_loop(j: int) -> None:
            reviewer = self.reviewers[j]
            server = j % self.k
            for item in items[j * per : (j + 1) * per]:
                if self.args.rate:  # a pause before each decision: the team decides at ~rate/s
                    await asyncio.sleep(rng.expovariate(self.args.rate / r))
                try:
                    if variant == "ours":
                        pk, t0, ta, tb, tc = await self.decide_ours(reviewer, item, server)
                    else:
                        pk, t0, ta, tb, tc = await self.decide_floor(reviewer, item, server)
                except (OSError, WebSocketException, httpx.HTTPError) as exc:
                    raise BenchError(
                        f"{variant} decision (R={r}, reviewer {j}, server {server}) failed: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                result.a.append((ta - t0) * 1000)
                result.b.append((tb - t0) * 1000)
                if tc is not None:
                    result.c.append((tc - t0) * 1000)
                result.events.append((pk, t0, ta, tb))

        cpu = CpuMeter(self.topo)
        cpu.start()
        lag.start()
        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(reviewer_loop(j) for j in range(r)))
        finally:
            result.seconds = time.perf_counter() - t0
            result.lag = await lag.stop()
            result.cpu = cpu.stop()
            if audience:
                decided = {pk for pk, *_ in result.events}
                deadline = time.perf_counter() + 10  # the last fan-outs reach every inbox
                while time.perf_counter() < deadline:
                    missed = sum(len(decided - set(o.arrivals)) for o in audience)
                    if not missed:
                        break
                    await asyncio.sleep(0.1)
                result.audience_missed = missed
                result.audience_sockets = len(audience)
                if missed:
                    closed = [o.closed for o in audience if o.closed is not None]
                    self.notes.append(
                        f"{variant} R={r} round {rnd + 1}: {missed} (socket, decision) card drops "
                        f"never arrived; {len(closed)} inbox socket(s) closed"
                        + (f", e.g. {closed[0]!r}" if closed else "")
                    )
            for o in audience:
                await o.stop()
        self.topo.check_alive()
        return result


def summarize(xs: list[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "p50": percentile(xs, 0.5),
        "p95": percentile(xs, 0.95),
        "p99": percentile(xs, 0.99),
        "max": max(xs) if xs else float("nan"),
    }


def pooled(phases: list[Phase], variant: str, r: int, metric: str) -> list[float]:
    out: list[float] = []
    for p in phases:
        if p.variant == variant and p.reviewers == r:
            out.extend(getattr(p, metric))
    return out


def read_traces(topo: Topology) -> dict[int, tuple[float, float, float, float, int]]:
    """BENCH-TRACE lines from the servers' logs: pk -> (commit hook, build start, build end,
    publisher.send returned, 0)."""
    out = {}
    for p in topo.servers:
        try:
            text = p.log.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("BENCH-TRACE "):
                _, pk, q, b0, b1, sent, depth = line.split()
                out[int(pk)] = (float(q), float(b0), float(b1), float(sent), int(depth))
    return out


def print_trace(phases: list[Phase], traces, rs: list[int]) -> None:
    print("(b) for ours, split with --trace (ms; p50 / p95 over the traced decisions)")
    parts = [
        "POST -> commit hook",
        "commit hook -> build",
        "build message",
        "send() (queued)",
        "send() returned -> client",
    ]
    head = (
        f"{'R':>3}  {'n':>4}  "
        + "  ".join(f"{p[:22]:>22}" for p in parts)
        + "  queue depth p50/max"
    )
    print(head)
    print("-" * len(head))
    for r in rs:
        cols: list[list[float]] = [[] for _ in parts]
        depth: list[float] = []
        for ph in phases:
            if ph.variant != "ours" or ph.reviewers != r:
                continue
            for pk, t0, _ta, tb in ph.events:
                tr = traces.get(pk)
                if tr is None:
                    continue
                q, b0, b1, sent, d = tr
                for i, x in enumerate((q - t0, b0 - q, b1 - b0, sent - b1, tb - sent)):
                    cols[i].append(x * 1000)
                depth.append(d)
        if not depth:
            print(f"{r:>3}  no trace lines matched")
            continue
        cells = "  ".join(
            f"{percentile(c, 0.5):>10.1f} / {percentile(c, 0.95):<9.1f}" for c in cols
        )
        print(f"{r:>3}  {len(depth):>4}  {cells}  {percentile(depth, 0.5):.0f}/{max(depth):.0f}")
    print()


def print_report(phases: list[Phase], args, bench: Bench, topo: Topology) -> bool:
    rs = args.reviewers_list
    print()
    print(
        f"Decision latency: {len(topo.servers)} Daphne server(s), {len(topo.workers)} db_worker(s), "
        f"PostgreSQL + Redis on loopback, DEBUG off, pool {'on' if not args.no_pool else 'off'}, "
        f"prepared statements {'off' if args.no_prepared else 'on'}, "
        f"worker poll {args.worker_interval} s; {args.rounds} round(s), ours and floor alternating."
    )
    pace = (
        f"paced: the team decides ~{args.rate:g} decisions/s (each reviewer pauses a random "
        f"exponential time, mean R/{args.rate:g} s, before each decision)"
        if args.rate
        else "back to back: each reviewer decides again as soon as the previous decision is done"
    )
    audience = (
        "every deciding reviewer also has its own inbox open"
        if args.audience
        else "no reviewer inboxes besides the observers"
    )
    print(f"R reviewers decide distinct requests, {pace}; {audience}.")
    print("Percentiles over all rounds' samples (ms).")
    print()
    head = f"{'R':>3}  {'measure':<44} {'n':>5} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}"
    print(head)
    print("-" * len(head))
    labels = {
        ("a", "ours"): "(a) POST decline -> HTTP response      ours",
        ("a", "floor"): "(a)                                    floor",
        ("b", "ours"): "(b) POST -> other reviewer's inbox ws  ours",
        ("b", "floor"): "(b)                                    floor",
        ("c", "ours"): "(c) POST -> run done (run ws)          ours",
    }
    for r in rs:
        for (metric, variant), label in labels.items():
            s = summarize(pooled(phases, variant, r, metric))
            print(
                f"{r:>3}  {label:<44} {s['n']:>5} {s['p50']:>8.1f} {s['p95']:>8.1f} "
                f"{s['p99']:>8.1f} {s['max']:>8.1f}"
            )
        print()

    print("ours / floor (same run; pooled percentiles; per-round p50 ratios of (a) in brackets)")
    head = (
        f"{'R':>3}  {'(a) p50':>8} {'(a) p95':>8} {'(a) p99':>8}  "
        f"{'(b) p50':>8} {'(b) p95':>8} {'(b) p99':>8}  (a) p50 per round"
    )
    print(head)
    print("-" * len(head))
    ratios: dict[int, dict[str, float]] = {}
    for r in rs:
        row = {}
        for metric in ("a", "b"):
            o = summarize(pooled(phases, "ours", r, metric))
            f = summarize(pooled(phases, "floor", r, metric))
            for q in ("p50", "p95", "p99"):
                row[f"{metric}_{q}"] = o[q] / f[q] if f[q] else float("nan")
        per_round = []
        for rnd in range(args.rounds):
            o = [p for p in phases if (p.variant, p.reviewers, p.round) == ("ours", r, rnd)]
            f = [p for p in phases if (p.variant, p.reviewers, p.round) == ("floor", r, rnd)]
            if o and f:
                per_round.append(percentile(o[0].a, 0.5) / percentile(f[0].a, 0.5))
        ratios[r] = row
        print(
            f"{r:>3}  {row['a_p50']:>7.2f}x {row['a_p95']:>7.2f}x {row['a_p99']:>7.2f}x  "
            f"{row['b_p50']:>7.2f}x {row['b_p95']:>7.2f}x {row['b_p99']:>7.2f}x  "
            f"[{', '.join(f'{x:.2f}' for x in per_round)}]"
        )
    print()

    if args.trace:
        print_trace(phases, read_traces(topo), rs)

    print(
        "context per phase (median over rounds); CPU ms per decision, all rounds: servers, "
        "workers, PostgreSQL, Redis, this client"
    )
    parts = ("servers", "workers", "postgres", "redis", "client")
    head = (
        f"{'R':>3}  {'variant':<7} {'decisions/s':>11} {'client loop lag p50/p99 ms':>27}  "
        + " ".join(f"{p[:8]:>8}" for p in parts)
        + f" {'total':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rs:
        for variant in ("ours", "floor"):
            ps = [p for p in phases if p.variant == variant and p.reviewers == r]
            if not ps:
                continue
            rate = statistics.median(len(p.a) / p.seconds for p in ps if p.seconds)
            lag = [x for p in ps for x in p.lag]
            n = sum(len(p.a) for p in ps) or 1
            per = {part: 1000 * sum(p.cpu.get(part, 0.0) for p in ps) / n for part in parts}
            print(
                f"{r:>3}  {variant:<7} {rate:>11.1f} "
                f"{percentile(lag, 0.5):>13.2f} / {percentile(lag, 0.99):<8.2f}  "
                + " ".join(f"{per[part]:>8.1f}" for part in parts)
                + f" {sum(per.values()):>7.1f}"
            )
    print()

    ok = True
    top = max(rs)
    b99 = summarize(pooled(phases, "ours", top, "b"))["p99"]
    if top >= 50:
        verdict = "OK" if b99 < GOAL_B_P99_MS else "MISSED"
        ok &= verdict == "OK"
        print(
            f"goal (b) p99 at {top} reviewers < {GOAL_B_P99_MS:.0f} ms: {b99:8.1f} ms   {verdict}"
        )
    else:
        print(f"goal (b) p99 at 50 reviewers: n/a (largest R run: {top}; its p99 {b99:.1f} ms)")
    for r in rs:
        for q in ("p50", "p99"):
            x = ratios[r][f"a_{q}"]
            verdict = "OK" if x <= GOAL_A_RATIO else "MISSED"
            ok &= verdict == "OK"
            print(
                f"goal (a) ours/floor <= {GOAL_A_RATIO:.0f}x at R={r:<3} ({q}): {x:6.2f}x        {verdict}"
            )
    fanout = [(p.audience_sockets, p.audience_missed) for p in phases if p.audience_sockets]
    if fanout:
        missed = sum(m for _, m in fanout)
        delivered = (
            "every" if not missed else f"{missed} (socket, decision) pairs MISSING: not every"
        )
        print(
            f"fan-out: {delivered} decision reached every reviewer's open inbox "
            f"({max(n for n, _ in fanout)} sockets at the largest R)"
        )
        ok &= not missed
    if bench.ws_failures:
        bench.notes.append(
            f"{len(bench.ws_failures)} run-page websocket handshake(s) failed and were retried "
            f"(before the timed POST), e.g. {bench.ws_failures[0]}"
        )
    for note in bench.notes:
        print(f"note: {note}")
    return ok


async def run(args, topo: Topology) -> int:
    rs = args.reviewers_list
    per_r = {r: max(2, math.ceil(args.samples / r)) for r in rs}
    needed = args.rounds * sum(per_r[r] * r for r in rs)
    warm = args.warmup * len(topo.servers)  # taken twice if the observers must reconnect
    users = topo.setup_users(max(*rs, len(topo.servers)) + 1)
    reviewers, observer = users[:-1], users[-1]

    ours_pool = await create_pending_runs(topo, reviewers[0].token, needed + 2 * warm)
    out = topo.manage(
        ["shell", "--no-imports", "-c", FLOOR_ROWS],
        timeout=120,
        input=json.dumps({"n": needed + 2 * warm}),
    )
    line = next(ln for ln in out.splitlines() if ln.startswith("BENCH-FLOOR "))
    floor_pool = json.loads(line[len("BENCH-FLOOR ") :])

    bench = Bench(topo, reviewers, observer, args)
    phases: list[Phase] = []
    try:
        await bench.open(args.observer_path)
        # Warm-up: every server decides a few of each kind (imports, pools, template caches).
        # It also finds out whether the observers survive a real decision.
        k = len(topo.servers)

        async def warm_up() -> None:
            for i in range(warm):
                await bench.decide_ours(reviewers[i % k], ours_pool.pop(), i % k)
                await bench.decide_floor(reviewers[i % k], floor_pool.pop(), i % k)

        try:
            await warm_up()
        except (BenchError, ConnectionError) as exc:
            crashed = [o for o in bench.observers if o.closed is not None]
            if not crashed or args.observer_path == FALLBACK_OBSERVER_PATH:
                raise
            problems = [p for p in topo.log_problems() if "Error" in p or "Exception" in p]
            bench.notes.append(
                f"DEFECT: the inbox websocket {args.observer_path} was closed by the server after "
                f"a decision ({crashed[0].closed}; {exc}); last server log error: "
                f"{problems[-1] if problems else 'none logged'}. (b) was measured on "
                f"{FALLBACK_OBSERVER_PATH} instead (an inbox filtered by agent)."
            )
            print(f"warning: {bench.notes[-1]}", file=sys.stderr, flush=True)
            await bench.open_observers(FALLBACK_OBSERVER_PATH)
            await warm_up()

        profiled = False
        for rnd in range(args.rounds):
            for r in rs:
                n = per_r[r] * r
                order = ("ours", "floor") if (rnd + rs.index(r)) % 2 == 0 else ("floor", "ours")
                for variant in order:
                    if variant == "ours":
                        items, ours_pool = ours_pool[:n], ours_pool[n:]
                    else:
                        items, floor_pool = floor_pool[:n], floor_pool[n:]
                    spy = None
                    if args.profile and variant == "ours" and r == max(rs) and not profiled:
                        spy = Profiler(topo, args.profile, f"R{r}")
                        spy.start()
                        await asyncio.sleep(0.5)  # py-spy attaches
                    try:
                        p = await bench.phase(variant, r, rnd, items)
                    finally:
                        if spy is not None:
                            profiled = True
                            files = spy.stop()
                    phases.append(p)
                    print(
                        f"  round {rnd + 1}/{args.rounds}  R={r:<3} {variant:<5}  {len(p.a)} decisions "
                        f"in {p.seconds:5.1f} s   (a) p50 {percentile(p.a, 0.5):6.1f} ms   "
                        f"(b) p50 {percentile(p.b, 0.5):6.1f} ms"
                        + (f"   (c) p50 {percentile(p.c, 0.5):6.1f} ms" if p.c else ""),
                        flush=True,
                    )
                    if spy is not None:
                        print(f"  profiled R={r} ours: raw py-spy files in {args.profile}")
                        for name, path in files:
                            print(f"  -- {name}: " + "\n     ".join(profile_summary(path)))
    finally:
        await bench.close()

    # Every decided run must have ended done exactly once.
    statuses = dict(
        topo.sql(
            "SELECT r.status, count(*) FROM approvals_run r JOIN approvals_approvalrequest q "
            "ON q.run_id = r.id WHERE q.state = 'declined' AND q.request_id NOT LIKE 'floor-%%' "
            "GROUP BY r.status"
        )
    )
    if set(statuses) - {"done"}:
        bench.notes.append(f"runs of declined requests not all done: {statuses}")
    dup = topo.sql(
        "SELECT count(*) FROM (SELECT run_id FROM approvals_event WHERE action = 'run_done' "
        "GROUP BY run_id HAVING count(*) > 1) d"
    )[0][0]
    if dup:
        bench.notes.append(f"{dup} run(s) have more than one run_done event")
    problems = topo.log_problems()
    if problems:
        bench.notes.append(f"{len(problems)} error line(s) in the process logs, e.g. {problems[0]}")

    ok = print_report(phases, args, bench, topo)
    if args.json:
        data = [
            {
                "variant": p.variant,
                "reviewers": p.reviewers,
                "round": p.round,
                "seconds": p.seconds,
                "a_ms": p.a,
                "b_ms": p.b,
                "c_ms": p.c,
            }
            for p in phases
        ]
        args.json.write_text(json.dumps({"phases": data, "notes": bench.notes}, indent=1) + "\n")
    return 0 if ok or not args.strict else 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reviewers", default="1,10,50", help="comma list of R (default 1,10,50)")
    ap.add_argument(
        "--samples", type=int, default=100, help="decisions per R, variant and round (default 100)"
    )
    ap.add_argument("--rounds", type=int, default=2, help="repetitions, order alternated")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up decisions per server and kind")
    ap.add_argument("--observer-path", default="/ws/inbox/", help="the observers' inbox socket")
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="paced: the team decides about RATE decisions/s in all (each reviewer pauses a "
        "random exponential time, mean R/RATE s, before each decision); 0 = back to back",
    )
    ap.add_argument(
        "--no-audience",
        dest="audience",
        action="store_false",
        help="do not open every deciding reviewer's own inbox socket",
    )
    ap.add_argument("--timeout", type=float, default=60, help="per-step timeout (s)")
    ap.add_argument("--profile", type=Path, help="py-spy every process during the largest R (ours)")
    ap.add_argument(
        "--trace", action="store_true", help="split (b) into its parts (wraps the broadcaster)"
    )
    ap.add_argument("--json", type=Path, help="also write every sample to this file")
    ap.add_argument("--strict", action="store_true", help="exit 2 when a goal is missed")
    add_topology_args(
        ap,
        db_name="toolnexus_bench_latency",
        redis_db=5,
        workers_help="db_worker processes (default 2)",
    )
    args = ap.parse_args(argv)
    try:
        args.reviewers_list = sorted({int(x) for x in args.reviewers.split(",") if x.strip()})
    except ValueError:
        ap.error("--reviewers: a comma list of integers")
    if not args.reviewers_list or min(args.reviewers_list) < 1 or args.rounds < 1:
        ap.error("--reviewers must be >= 1 and --rounds >= 1")
    if args.servers < 2:
        print("warning: with one server the observer shares the deciding server's process")
    if args.samples < 20:
        ap.error("--samples must be >= 20")

    try:
        require_websockets()
        cfg = config_from_args(args, **({"BENCH_TRACE": "1"} if args.trace else {}))
    except BenchError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1
    return run_benchmark(cfg, lambda topo: run(args, topo))


if __name__ == "__main__":
    sys.exit(main())
