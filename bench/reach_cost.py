"""What reaching people and hosts costs the decision path: a decision's latency with nothing
subscribed (A) against 3 notification channels per reviewer and 2 webhook subscriptions (B).

    python bench/reach_cost.py                        # 6 alternating rounds of 100 decisions
    python bench/reach_cost.py --rounds 4 --decisions 50
    python bench/reach_cost.py --deliveries process   # the delivery worker in its own process
    python bench/reach_cost.py --pause 0.5            # paced: 0.5 s between decisions
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_reach python bench/reach_cost.py

The database: DATABASE_URL when given (an existing, empty PostgreSQL database of yours: this
bench migrates it and leaves it), else a SQLite file in a temp folder. One process runs the
decision path as a host's server and worker would: a reviewer's `POST
/api/requests/{id}/decline` through Django's full stack (`django.test.Client`, Bearer token,
the project's URLs and middleware), then the run worker (`Worker.drain`, this thread) resumes
the run to `done`. The delivery worker runs as `db_worker` runs it by default, in a thread
beside the run worker (`DeliveryWorker.run_forever`), or with `--deliveries process` as
`manage.py db_worker --queue-name webhooks` in a process of its own. TOOLNEXUS_NOTIFICATIONS
is on in both phases; what differs is who subscribed:

- A: nobody (every preference off, both webhook subscriptions inactive);
- B: each of `--reviewers` reviewers hears of every new request by email (Django's file
  backend into a temp folder), chat (an apprise `json://` URL) and Web Push (one browser
  subscription, real keys: pywebpush encrypts and signs with VAPID), and 2 webhook
  subscriptions hear every host event; chat, push and webhooks go to a receiver on loopback
  (its own process) that counts what it gets.

Per decision, untimed: a demo run is started and driven to its pending refund request (a
"request.created" event each time, so notifications keep coming); timed: (a) the POST to its
HTTP answer, (c) the POST to the run `done`. The decision path's statements (this thread's
connection) and this thread's CPU are counted too: equal in A and B, the reach work is not on
the path. Rounds alternate A and B (the order flips every round); after each phase, untimed,
the bench waits until every delivery is made, and counts what the receivers got during the
phase and after it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REASON = "bench: amount exceeds refund policy"
GOAL = 1.10  # B / A


# -- the receiver (its own process) ---------------------------------------------------------------


def receiver() -> int:
    """Counts POSTs by their first path segment (chat, push, hook); GET /counts reads them."""
    counts: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            kind = self.path.strip("/").split("/")[0]
            with lock:
                counts[kind] = counts.get(kind, 0) + 1
            self._answer(201 if kind == "push" else 200, b"{}")

        def do_GET(self):
            with lock:
                body = json.dumps(counts).encode()
            self._answer(200, body)

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


def start_receiver() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--receiver"], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline().split()
    if line[:1] != ["READY"]:
        proc.kill()
        raise SystemExit("the receiver did not start")
    return proc, int(line[1])


# -- set-up ---------------------------------------------------------------------------------------


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def p256() -> tuple[str, str]:
    """A fresh P-256 pair: (base64url private number, base64url uncompressed public point)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    point = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return b64url(key.private_numbers().private_value.to_bytes(32, "big")), b64url(point)


def environment(tmp: Path) -> dict[str, str]:
    private, public = p256()
    env = {
        "DJANGO_SETTINGS_MODULE": "toolnexus_web.settings",
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": "bench-" + secrets.token_urlsafe(32),
        "DJANGO_ALLOWED_HOSTS": "testserver,127.0.0.1,localhost",
        "DJANGO_SECURE_COOKIES": "0",  # plain HTTP, as the topology benches
        "TOOLNEXUS_LOG_LEVEL": "WARNING",
        "TOOLNEXUS_DEMO_AGENT": "1",
        # The demo model's words arrive at once: the path is CPU, not sleeps, so contention
        # with the delivery work shows.
        "TOOLNEXUS_DEMO_WORD_SECONDS": "0",
        "TOOLNEXUS_API_TOKEN_RATE": "0",
        "TOOLNEXUS_API_USER_RATE": "0",
        "TOOLNEXUS_RUNS_PER_MINUTE": "0",
        "TOOLNEXUS_NOTIFICATIONS": "1",
        "TOOLNEXUS_PUBLIC_BASE_URL": "https://approvals.example.test",
        "TOOLNEXUS_VAPID_PUBLIC_KEY": public,
        "TOOLNEXUS_VAPID_PRIVATE_KEY": private,
        "TOOLNEXUS_VAPID_SUBJECT": "mailto:ops@example.test",
        "DJANGO_EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "DJANGO_EMAIL_FILE_PATH": str(tmp / "mail"),
        "DJANGO_STATIC_ROOT": str(tmp / "static"),
        "DATABASE_POOL": "0",  # one connection per thread, held: the statements counted
    }
    if not os.environ.get("DATABASE_URL"):
        env["TOOLNEXUS_SQLITE_PATH"] = str(tmp / "bench.sqlite3")
    return env


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.pop("REDIS_URL", None)  # the in-memory channel layer
    import django

    warnings.filterwarnings("ignore", message="No directory at")
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.DATABASES["default"]["CONN_MAX_AGE"] = None  # kept between tasks
    call_command("migrate", verbosity=0)
    # DEBUG off: a push names the app's icon through the static files' manifest.
    call_command("collectstatic", interactive=False, verbosity=0)


class Reach:
    """The B phase's subscribers, made once; `set(on)` turns them on or off."""

    def __init__(self, reviewers: list, port: int) -> None:
        from approvals.models import (
            NotificationPreference,
            WebhookSubscription,
            WebPushSubscription,
        )

        origin = f"127.0.0.1:{port}"
        for user in reviewers:
            NotificationPreference.objects.create(
                user=user,
                email=f"{user.username}@bench.test",
                chat_urls=f"json://{origin}/chat/{user.username}",
            )
            _, public = p256()
            WebPushSubscription.objects.create(
                user=user,
                endpoint=f"http://{origin}/push/{user.username}",
                p256dh=public,
                auth=b64url(os.urandom(16)),
            )
        self.users = [u.pk for u in reviewers]
        self.hooks = [
            WebhookSubscription.objects.create(
                url=f"http://{origin}/hook/{i}",
                secret=WebhookSubscription.generate_secret(),
                active=False,
            ).pk
            for i in (1, 2)
        ]

    def set(self, on: bool) -> None:
        from approvals import event_feed
        from approvals.models import NotificationPreference, WebhookSubscription

        NotificationPreference.objects.filter(user_id__in=self.users).update(
            email_enabled=on, chat_enabled=on, push_enabled=on
        )
        # A subscription turned on hears from now on (not the A phase's events).
        WebhookSubscription.objects.filter(pk__in=self.hooks).update(
            active=on, last_event_id=event_feed.latest_event_id()
        )


def mails(folder: Path) -> int:
    """Messages the file backend wrote (each ends with a line of 79 dashes)."""
    if not folder.is_dir():
        return 0
    return sum(p.read_bytes().count(b"\n" + b"-" * 79 + b"\n") for p in folder.iterdir())


def received(port: int, folder: Path) -> dict[str, int]:
    import httpx

    got = httpx.get(f"http://127.0.0.1:{port}/counts").json()
    return {
        "email": mails(folder),
        "chat": got.get("chat", 0),
        "push": got.get("push", 0),
        "hooks": got.get("hook", 0),
    }


def pending_deliveries() -> int:
    from approvals.models import NotificationDelivery, NotificationItem, WebhookDelivery

    return (
        NotificationDelivery.objects.filter(state="pending").count()
        + WebhookDelivery.objects.filter(state="pending").count()
        + NotificationItem.objects.filter(sent_at__isnull=True).count()
    )


def settle(port: int, folder: Path, timeout: float = 120.0) -> None:
    """Wait (untimed) until the phase's events are dispatched and every delivery made: events
    settle 1 s, dispatch runs every 1 s; then nothing pending and the counts still."""
    time.sleep(2.5)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        now = (pending_deliveries(), received(port, folder))
        if now[0] == 0 and now == last:
            return
        last = now
        time.sleep(1.0)
    raise SystemExit(f"deliveries still pending after {timeout:.0f} s: {last}")


def failed_deliveries() -> int:
    from approvals.models import NotificationDelivery, WebhookDelivery

    return (
        NotificationDelivery.objects.exclude(state="delivered").count()
        + WebhookDelivery.objects.exclude(state="delivered").count()
    )


# -- the decision path ----------------------------------------------------------------------------


class Statements:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def phase(n: int, user, client, worker, tag: str, hold: float, pause: float = 0.0) -> dict:
    """n decisions; per decision (a) POST -> HTTP answer and (c) POST -> run done, in ms.

    A request is decided `hold` seconds after it arrived at the earliest, the oldest first:
    notifications are made only for requests still pending when the delivery worker reads
    them (events settle 1 s, dispatch every 1 s), so new runs are started (untimed) until the
    oldest waiting one is old enough (with `pause`, `pause` seconds apart). Those left at the end are declined, untimed."""
    from collections import deque

    from django.db import connection

    from approvals import services
    from approvals.models import Run

    waiting: deque = deque()
    started = 0

    def start_one() -> None:
        nonlocal started
        run = services.run_start(
            agent="demo", prompt=f"Refund order {tag}-{started:05d}, $5", started_by=user
        )
        started += 1
        worker.drain(max_tasks=10)
        waiting.append((time.monotonic(), run.pk, run.requests.get().request_id))

    def decline(request_id: str):
        return client.post(
            f"/api/requests/{request_id}/decline",
            data={"reason": REASON},
            content_type="application/json",
        )

    a_ms, c_ms, cpu_ms = [], [], []
    counter = Statements()
    for _ in range(n):
        start_one()
        while time.monotonic() - waiting[0][0] < hold:
            if pause:  # paced: runs arrive at the decisions' pace while the first ones wait
                time.sleep(pause)
            start_one()
        _, run_pk, request_id = waiting.popleft()
        with connection.execute_wrapper(counter):
            cpu0, t0 = time.thread_time(), time.perf_counter()
            answer = decline(request_id)
            t1 = time.perf_counter()
            worker.drain(max_tasks=10)
            t2, cpu2 = time.perf_counter(), time.thread_time()
        if answer.status_code != 200:
            raise SystemExit(f"decline answered {answer.status_code}: {answer.content[:300]!r}")
        status = Run.objects.filter(pk=run_pk).values_list("status", flat=True).get()
        if status != "done":
            raise SystemExit(f"run {run_pk} ended {status}, not done")
        a_ms.append((t1 - t0) * 1000)
        c_ms.append((t2 - t0) * 1000)
        cpu_ms.append((cpu2 - cpu0) * 1000)
        if pause:
            time.sleep(pause)  # a team's pace: the delivery worker may catch up meanwhile
    left = len(waiting)
    while waiting:
        decline(waiting.popleft()[2])
    worker.drain(max_tasks=left * 2 + 10)
    return {"a": a_ms, "c": c_ms, "cpu": cpu_ms, "statements": counter.count / n, "runs": started}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def process_cpu_ns(pid: int | str, *, but: int | None = None) -> int:
    """CPU of a process's threads (`/proc/<pid>/task/*/schedstat`, ns), but thread `but`."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if task.name == str(but):
            continue
        with contextlib.suppress(OSError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--decisions", type=int, default=100, help="per phase and round")
    parser.add_argument("--warmup", type=int, default=20, help="per phase, before round 1")
    parser.add_argument("--reviewers", type=int, default=2, help="reviewers with 3 channels")
    parser.add_argument(
        "--hold", type=float, default=3.0, help="seconds a request waits before its decision"
    )
    parser.add_argument(
        "--pause", type=float, default=0.0, help="seconds between decisions (0: back to back)"
    )
    parser.add_argument("--deliveries", choices=("thread", "process"), default="thread")
    parser.add_argument("--json", help="write every sample here")
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        return receiver()

    tmp = Path(tempfile.mkdtemp(prefix="bench-reach-"))
    env = environment(tmp)
    setup_django(env)
    from django.db import connection
    from django.test import Client

    from approvals import services
    from approvals.execution.worker import DeliveryWorker, Worker
    from approvals.testing import make_user

    rx, port = start_receiver()
    children = [rx]
    deliveries = thread = None
    try:
        decider = make_user(role="reviewer", username="bench-decider")
        others = [make_user(role="reviewer") for _ in range(args.reviewers - 1)]
        token, _ = services.api_token_create(user=decider, name="bench")
        client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        reach = Reach([decider, *others], port)
        worker = Worker(maintenance_every=0)
        if args.deliveries == "thread":
            deliveries = DeliveryWorker()
            thread = threading.Thread(target=deliveries.run_forever, name="webhooks", daemon=True)
            thread.start()
        else:
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(ROOT / "manage.py"),
                        "db_worker",
                        "--queue-name",
                        "webhooks",
                    ],
                    env={**os.environ, **env},
                    stdout=subprocess.DEVNULL,
                    stderr=open(tmp / "deliveries.log", "w"),  # noqa: SIM115
                )
            )
        time.sleep(1.0)
        folder = tmp / "mail"

        def cpu_of_deliveries() -> int:
            if thread is not None:  # the delivery worker's threads, and the others
                return process_cpu_ns("self", but=threading.main_thread().native_id)
            return process_cpu_ns(children[1].pid)

        def measure(name: str, n: int, tag: str) -> dict:
            reach.set(name == "B")
            before = received(port, folder)
            dcpu0, rcpu0 = cpu_of_deliveries(), process_cpu_ns(rx.pid)
            started = time.perf_counter()
            got = phase(n, decider, client, worker, tag, args.hold, args.pause)
            got["seconds"] = time.perf_counter() - started
            got["deliveries cpu ms"] = (cpu_of_deliveries() - dcpu0) / 1e6
            got["receiver cpu ms"] = (process_cpu_ns(rx.pid) - rcpu0) / 1e6
            during = received(port, folder)
            settle(port, folder)
            after = received(port, folder)
            got["during"] = {k: during[k] - before[k] for k in before}
            got["after"] = {k: after[k] - during[k] for k in before}
            reach.set(False)
            return got

        db = connection.vendor
        print(
            f"reach cost on {db} ({connection.settings_dict['NAME']}), deliveries in a "
            f"{args.deliveries}: {args.rounds} rounds x {args.decisions} decisions per phase; "
            f"B = {args.reviewers} reviewers x (email, chat, push) + 2 webhooks",
            flush=True,
        )
        for name in ("A", "B"):
            measure(name, args.warmup, f"W{name}")
        print(
            f"{'round':>5} {'phase':>5} {'(c) p50':>8} {'(c) p95':>8} {'(a) p50':>8}"
            f" {'(a) p95':>8} {'cpu ms':>7} {'stmts':>6} {'secs':>5} {'deliv cpu':>9}"
            f" {'rx cpu':>7}  received during phase (+ after it)",
            flush=True,
        )
        rounds = []
        for number in range(1, args.rounds + 1):
            order = ("A", "B") if number % 2 else ("B", "A")
            got = {}
            for name in order:
                got[name] = f = measure(name, args.decisions, f"R{number}{name}")
                recv = " ".join(f"{k} {f['during'][k]}(+{f['after'][k]})" for k in f["during"])
                print(
                    f"{number:>5} {name:>5} {pct(f['c'], 0.5):>8.2f} {pct(f['c'], 0.95):>8.2f}"
                    f" {pct(f['a'], 0.5):>8.2f} {pct(f['a'], 0.95):>8.2f}"
                    f" {statistics.median(f['cpu']):>7.2f} {f['statements']:>6.1f}"
                    f" {f['seconds']:>5.1f}"
                    f" {f['deliveries cpu ms']:>9.0f} {f['receiver cpu ms']:>7.0f}  {recv}",
                    flush=True,
                )
            rounds.append(got)
            ratios = {
                m: pct(got["B"][k], q) / pct(got["A"][k], q)
                for m, k, q in (("c p50", "c", 0.5), ("c p95", "c", 0.95), ("a p50", "a", 0.5))
            }
            got["ratios"] = ratios
            print(
                f"{number:>5}   B/A  " + "  ".join(f"{m} {r:.3f}" for m, r in ratios.items()),
                flush=True,
            )

        print()
        print(
            f"{'pooled over rounds':<22} {'A p50':>7} {'A p95':>7} {'B p50':>7} {'B p95':>7}"
            f" {'B/A p50':>8} {'B/A p95':>8}"
        )
        for label, key in (
            ("(c) POST -> run done", "c"),
            ("(a) POST -> HTTP answer", "a"),
            ("thread cpu ms (c)", "cpu"),
        ):
            a = [x for r in rounds for x in r["A"][key]]
            b = [x for r in rounds for x in r["B"][key]]
            print(
                f"{label:<22} {pct(a, 0.5):>7.2f} {pct(a, 0.95):>7.2f} {pct(b, 0.5):>7.2f}"
                f" {pct(b, 0.95):>7.2f} {pct(b, 0.5) / pct(a, 0.5):>8.3f}"
                f" {pct(b, 0.95) / pct(a, 0.95):>8.3f}"
            )
        for m in ("c p50", "c p95", "a p50"):
            values = [r["ratios"][m] for r in rounds]
            median = statistics.median(values)
            verdict = "OK" if median <= GOAL else "MISSED"
            print(
                f"B/A {m}: median of rounds {median:.3f} (goal <= {GOAL:.2f}) {verdict}"
                f"   rounds: {', '.join(f'{v:.3f}' for v in values)}"
            )
        stm = {p: statistics.mean(r[p]["statements"] for r in rounds) for p in ("A", "B")}
        total = {
            k: sum(r["B"]["during"][k] + r["B"]["after"][k] for r in rounds)
            for k in rounds[0]["B"]["during"]
        }
        during = sum(sum(r["B"]["during"].values()) for r in rounds)
        print(
            f"statements per decision on the path: A {stm['A']:.1f}, B {stm['B']:.1f};"
            f" delivered in B phases: {total} ({during} of {sum(total.values())} during the"
            f" timed phases); in A phases: "
            f"{sum(sum(r['A']['during'].values()) + sum(r['A']['after'].values()) for r in rounds)};"
            f" deliveries not delivered: {failed_deliveries()}"
        )
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
        if args.json:
            Path(args.json).write_text(json.dumps(rounds))
    finally:
        if deliveries is not None:
            deliveries.stop.set()
            thread.join(timeout=15)
        for child in reversed(children):
            child.terminate()
            child.wait(timeout=15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
