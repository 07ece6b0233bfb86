"""A production-like toolnexus topology for the load benchmarks, started and torn down here.

    with Topology(Config(db_name="toolnexus_bench_x", redis_db=5, servers=2, workers=2)) as topo:
        topo.start()
        reviewers = topo.setup_users(10)
        ...

What it starts (every process in its own session, logs in a temp folder, loopback only):

* a fresh PostgreSQL database on 127.0.0.1:5432 (dropped first if left over, migrated,
  dropped again at exit),
* a Redis database number of its own on 127.0.0.1:6379 (flushed at start and at exit),
* `collectstatic` into a temp folder (DEBUG is off, so WhiteNoise serves the manifest),
* K ASGI servers: `manage.py serve --no-worker --no-demo-accounts --port P` (Daphne),
* M `manage.py db_worker` processes.

All of them run with DJANGO_SETTINGS_MODULE=bench.floor_settings: the app's own settings
plus one bench-only URL (the floor view of decision_latency.py); nothing else differs.

Users, API tokens and sessions are made by a `manage.py shell -c` one-off. The parent process
reads the database directly (psycopg) for checks and queue depth; it never imports Django.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import cpu_breakdown

ROOT = Path(__file__).resolve().parent.parent
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
SETTINGS_MODULE = "bench.floor_settings"
RESERVED_DB_NAMES = {"postgres", "template0", "template1", "test", "test_test"}


class BenchError(RuntimeError):
    """A set-up or run failure with a message meant for the person running the bench."""


@dataclass
class Config:
    db_name: str
    redis_db: int
    servers: int = 2
    workers: int = 2
    worker_interval: float = 0.2
    pool: bool = True
    pool_size: int = 10
    prepared: bool = True
    keep_logs: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)


def add_topology_args(ap, *, db_name: str, redis_db: int, workers_help: str) -> None:
    """The flags both topology benches take for the processes they start."""
    ap.add_argument("--servers", type=int, default=2, help="Daphne processes (default 2)")
    ap.add_argument("--workers", type=int, default=2, help=workers_help)
    ap.add_argument("--worker-interval", type=float, default=0.2, help="idle poll of a worker (s)")
    ap.add_argument(
        "--no-pool", action="store_true", help="DATABASE_POOL off (a connection per request)"
    )
    ap.add_argument(
        "--pool-size", type=int, default=10, help="DATABASE_POOL_SIZE per process (default 10)"
    )
    ap.add_argument(
        "--no-prepared",
        action="store_true",
        help="DATABASE_PREPARED off (parameters bound on the client, no prepared statements)",
    )
    ap.add_argument("--db-name", default=db_name)
    ap.add_argument("--redis-db", type=int, default=redis_db)
    ap.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")


def config_from_args(args, **extra_env: str) -> Config:
    return Config(
        db_name=args.db_name,
        redis_db=args.redis_db,
        servers=args.servers,
        workers=args.workers,
        worker_interval=args.worker_interval,
        pool=not args.no_pool,
        pool_size=args.pool_size,
        prepared=not args.no_prepared,
        keep_logs=args.keep_logs,
        extra_env=extra_env,
    )


@dataclass
class Reviewer:
    username: str
    token: str
    session: str


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int | None = None


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int | str) -> float:
    """CPU seconds (user + system) a process has used, or 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _pids_named(names: tuple[str, ...]) -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() in names:
                    out.append(d.name)
            except OSError:
                continue
    return out


class CpuMeter:
    """CPU seconds used by each part of the topology between start() and stop(): servers,
    workers, PostgreSQL (every postgres process: backends do the queries), Redis, and this
    client. Processes that start in between (new PostgreSQL backends) count from zero."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.before: dict[str, dict[str, float]] = {}

    def _sample(self) -> dict[str, dict[str, float]]:
        return {
            "servers": {str(p.popen.pid): _cpu_of(p.popen.pid) for p in self.topo.servers},
            "workers": {str(p.popen.pid): _cpu_of(p.popen.pid) for p in self.topo.workers},
            "postgres": {pid: _cpu_of(pid) for pid in _pids_named(("postgres",))},
            "redis": {pid: _cpu_of(pid) for pid in _pids_named(("redis-server",))},
            "client": {"self": _cpu_of(os.getpid())},
        }

    def start(self) -> None:
        self.before = self._sample()

    def stop(self) -> dict[str, float]:
        after = self._sample()
        return {
            part: sum(v - self.before.get(part, {}).get(pid, 0.0) for pid, v in now.items())
            for part, now in after.items()
        }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _psycopg():
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - a dependency of the app
        raise BenchError(
            f"psycopg is not importable ({exc}); run from the project's venv"
        ) from None
    return psycopg


def _redis():
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - a dependency of channels-redis
        raise BenchError(f"redis is not importable ({exc}); run from the project's venv") from None
    return redis


class Topology:
    def __init__(self, cfg: Config) -> None:
        if cfg.db_name in RESERVED_DB_NAMES or not cfg.db_name.replace("_", "").isalnum():
            raise BenchError(f"refusing to use database name {cfg.db_name!r}")
        self.cfg = cfg
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{cfg.db_name}-"))
        self.logs = self.tmp / "logs"
        self.logs.mkdir()
        self.procs: list[Proc] = []
        self.servers: list[Proc] = []
        self.workers: list[Proc] = []
        self.db_created = False
        self._conn = None
        self._closed = False
        self.env = self._child_env()

    # -- context, signals ------------------------------------------------------------------

    def __enter__(self) -> Topology:
        atexit.register(self.close)
        # Ctrl+C raises KeyboardInterrupt in the parent only (children have their own
        # session); SIGTERM/SIGHUP become SystemExit, so `finally` blocks tear down too.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _raise_exit)
        # A shell starting us in the background may have set SIGINT to "ignore".
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and exc_type not in (KeyboardInterrupt, SystemExit):
            self.print_logs()
        self.close()

    # -- environment -----------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        return f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.cfg.db_name}"

    @property
    def redis_url(self) -> str:
        return f"redis://{REDIS_HOST}:{REDIS_PORT}/{self.cfg.redis_db}"

    def _child_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "pythonpath")
            and not k.startswith(("DJANGO_", "TOOLNEXUS_", "DATABASE_", "REDIS_"))
        }
        env.update(
            {
                "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": str(ROOT),
                "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
                "DATABASE_URL": self.database_url,
                "REDIS_URL": self.redis_url,
                "DJANGO_DEBUG": "0",
                "DJANGO_SECRET_KEY": "bench-" + secrets.token_urlsafe(32),
                "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
                # Plain HTTP on loopback: secure cookies would never be sent back.
                "DJANGO_SECURE_COOKIES": "0",
                "DJANGO_STATIC_ROOT": str(self.tmp / "static"),
                "TOOLNEXUS_WORKER_INTERVAL": str(self.cfg.worker_interval),
                "TOOLNEXUS_LOG_LEVEL": "WARNING",
                "TOOLNEXUS_DEMO_AGENT": "1",
                # A bench starts runs and decides faster than any run cap or API throttle.
                "TOOLNEXUS_RUNS_PER_MINUTE": "0",
                "TOOLNEXUS_API_TOKEN_RATE": "0",
                "TOOLNEXUS_API_USER_RATE": "0",
            }
        )
        # Both said either way: the settings' defaults (on) would make an unset "off" a no-op.
        env["DATABASE_POOL"] = "1" if self.cfg.pool else "0"
        env["DATABASE_POOL_SIZE"] = str(self.cfg.pool_size)
        env["DATABASE_PREPARED"] = "1" if self.cfg.prepared else "0"
        env.update(self.cfg.extra_env)
        return env

    # -- services --------------------------------------------------------------------------

    def check_services(self) -> None:
        psycopg = _psycopg()
        try:
            with psycopg.connect(
                host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", connect_timeout=5
            ) as conn:
                conn.execute("SELECT 1")
        except Exception as exc:
            raise BenchError(
                f"PostgreSQL is not reachable at {PG_HOST}:{PG_PORT} as user {PG_USER} "
                f"(trust auth expected): {exc}"
            ) from None
        redis = _redis()
        try:
            client = redis.Redis(
                host=REDIS_HOST,
                port=REDIS_PORT,
                db=self.cfg.redis_db,
                socket_timeout=5,
                socket_connect_timeout=5,
            )
            client.ping()
            client.close()
        except Exception as exc:
            raise BenchError(
                f"Redis is not reachable at {REDIS_HOST}:{REDIS_PORT}: {exc}"
            ) from None

    def _admin(self, sql: str) -> None:
        psycopg = _psycopg()
        with psycopg.connect(
            host=PG_HOST,
            port=PG_PORT,
            user=PG_USER,
            dbname="postgres",
            connect_timeout=5,
            autocommit=True,
        ) as conn:
            conn.execute("SET statement_timeout = '60s'")
            conn.execute(sql)

    def _flush_redis(self) -> None:
        redis = _redis()
        client = redis.Redis(
            host=REDIS_HOST, port=REDIS_PORT, db=self.cfg.redis_db, socket_timeout=5
        )
        try:
            client.flushdb()
        finally:
            client.close()

    # -- start -----------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        self.check_services()
        name = self.cfg.db_name
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{name}"')
        self.db_created = True
        self._flush_redis()
        self.manage(["migrate", "--noinput", "-v", "0"], timeout=180)
        self.manage(["collectstatic", "--noinput", "-v", "0"], timeout=180)
        self.start_servers(self.cfg.servers)
        self.start_workers(self.cfg.workers)
        self.wait_ready()
        print(
            f"topology up in {time.monotonic() - t0:.1f} s: PostgreSQL db {name}, Redis db "
            f"{self.cfg.redis_db}, {len(self.servers)} server(s) on ports "
            f"{','.join(str(s.port) for s in self.servers)}, {len(self.workers)} db_worker(s), "
            f"pool {'on' if self.cfg.pool else 'off'}, worker poll {self.cfg.worker_interval} s; "
            f"logs in {self.logs}",
            flush=True,
        )

    def manage(self, args: list[str], *, timeout: float, input: str | None = None) -> str:
        cmd = [sys.executable, str(ROOT / "manage.py"), *args]
        try:
            r = subprocess.run(
                cmd,
                cwd=ROOT,
                env=self.env,
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BenchError(
                f"`manage.py {' '.join(args[:2])}` timed out after {timeout} s"
            ) from None
        if r.returncode != 0:
            raise BenchError(
                f"`manage.py {' '.join(args[:2])}` failed ({r.returncode}):\n"
                f"{(r.stderr or r.stdout)[-4000:]}"
            )
        return r.stdout

    def _spawn(self, name: str, args: list[str], port: int | None = None) -> Proc:
        log = self.logs / f"{name}.log"
        fh = open(log, "wb")  # noqa: SIM115 - owned by the child for its lifetime
        popen = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        fh.close()
        proc = Proc(name, popen, log, port)
        self.procs.append(proc)
        return proc

    def start_servers(self, k: int) -> None:
        for _ in range(k):
            port = free_port()
            i = len(self.servers)
            args = ["serve", "--no-worker", "--no-demo-accounts", "--host", "127.0.0.1"]
            self.servers.append(self._spawn(f"server{i}", [*args, "--port", str(port)], port))

    def start_workers(self, m: int) -> None:
        for _ in range(m):
            i = len(self.workers)
            self.workers.append(
                self._spawn(f"worker{i}", ["db_worker", "--worker-id", f"bench-w{i}"])
            )

    def stop_workers(self, keep: int) -> None:
        """Stop all but `keep` workers (SIGTERM: each finishes its current task first)."""
        extra = self.workers[keep:]
        self.workers = self.workers[:keep]
        for p in extra:
            _terminate(p.popen, grace=30)

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        pending = list(self.servers)
        while pending:
            self.check_alive()
            for s in list(pending):
                try:
                    with socket.create_connection(("127.0.0.1", s.port), timeout=1) as c:
                        c.settimeout(5)
                        c.sendall(
                            b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            b"Connection: close\r\n\r\n"
                        )
                        head = c.recv(64)
                    if head.startswith(b"HTTP/1.1 200"):
                        pending.remove(s)
                    else:
                        raise BenchError(f"{s.name} answered {head[:40]!r} on /accounts/login/")
                except OSError:
                    pass
            if pending and time.monotonic() > deadline:
                raise BenchError(f"server(s) not ready after {timeout} s: {pending[0].name}")
            if pending:
                time.sleep(0.2)
        # Workers log nothing at WARNING when they start; give them a moment to connect.
        time.sleep(0.5)
        self.check_alive()

    def check_alive(self) -> None:
        for p in self.procs:
            if p in self.servers or p in self.workers:
                code = p.popen.poll()
                if code is not None:
                    raise BenchError(f"{p.name} exited with status {code}:\n{_tail(p.log)}")

    # -- users -----------------------------------------------------------------------------

    def setup_users(self, n: int, *, prefix: str = "bench-r") -> list[Reviewer]:
        """n reviewers (group Reviewers), each with an API token and a logged-in session."""
        out = self.manage(
            ["shell", "--no-imports", "-c", SETUP_USERS],
            timeout=120,
            input=json.dumps({"n": n, "prefix": prefix}),
        )
        line = next((ln for ln in out.splitlines() if ln.startswith("BENCH-USERS ")), None)
        if line is None:
            raise BenchError(f"user set-up printed no result:\n{out[-2000:]}")
        return [Reviewer(**u) for u in json.loads(line[len("BENCH-USERS ") :])]

    # -- database reads (parent side) --------------------------------------------------------

    def sql(self, query: str, params: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        psycopg = _psycopg()
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                host=PG_HOST,
                port=PG_PORT,
                user=PG_USER,
                dbname=self.cfg.db_name,
                connect_timeout=5,
                autocommit=True,
            )
            self._conn.execute("SET statement_timeout = '30s'")
        return self._conn.execute(query, params).fetchall()

    # -- logs and teardown -----------------------------------------------------------------

    def print_logs(self, lines: int = 40) -> None:
        for p in self.procs:
            print(f"\n----- {p.name} (last {lines} lines of {p.log}) -----", file=sys.stderr)
            print(_tail(p.log, lines), file=sys.stderr)

    def log_problems(self) -> list[str]:
        """Lines that look like errors in the processes' logs (tracebacks, ERROR records)."""
        found = []
        for p in self.procs:
            try:
                text = p.log.read_text(errors="replace")
            except OSError:
                continue
            for ln in text.splitlines():
                if "Traceback" in ln or "ERROR" in ln or "Exception" in ln:
                    found.append(f"{p.name}: {ln.strip()[:200]}")
        return found

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in reversed(self.procs):
            with contextlib.suppress(Exception):
                _terminate(p.popen, grace=10)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        if self.db_created:
            try:
                self._admin(f'DROP DATABASE IF EXISTS "{self.cfg.db_name}" WITH (FORCE)')
            except Exception as exc:
                print(
                    f"warning: could not drop database {self.cfg.db_name}: {exc}", file=sys.stderr
                )
        with contextlib.suppress(Exception):
            self._flush_redis()
        if self.cfg.keep_logs:
            print(f"logs kept in {self.logs}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def run_benchmark(cfg: Config, measure) -> int:
    """Start the topology, run `measure(topo)` (a coroutine) in it, tear it down whatever
    happens, and turn the usual ways of stopping into an exit code."""
    import asyncio

    try:
        with Topology(cfg) as topo:
            topo.start()
            return asyncio.run(measure(topo))
    except BenchError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; topology torn down", file=sys.stderr)
        return 130
    except SystemExit as exc:
        if exc.code not in (0, None):
            print(f"\nstopped by a signal ({exc.code}); topology torn down", file=sys.stderr)
        raise


def _terminate(popen: subprocess.Popen[bytes], grace: float) -> None:
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(timeout=5)


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


# Run by `manage.py shell -c`, parameters as JSON on stdin.
SETUP_USERS = """
import json, sys
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from approvals import services
from approvals.permissions import ensure_groups
params = json.loads(sys.stdin.read())
reviewers = ensure_groups()["Reviewers"]
User = get_user_model()
out = []
for i in range(params["n"]):
    user, _ = User.objects.get_or_create(username=f"{params['prefix']}{i}")
    user.groups.add(reviewers)
    token, _ = services.api_token_create(user=user, name="bench")
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    out.append({"username": user.username, "token": token, "session": session.session_key})
print("BENCH-USERS " + json.dumps(out))
"""


# -- shared client-side helpers --------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan when empty."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def http_client(base_url: str, concurrency: int, timeout: float = 30.0):
    """An httpx.AsyncClient for one server: keep-alive, never a proxy (loopback only)."""
    import httpx

    limits = httpx.Limits(
        max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8
    )
    return httpx.AsyncClient(
        base_url=base_url, timeout=timeout, limits=limits, trust_env=False, http2=False
    )


def ws_connect(port: int, path: str, session: str, timeout: float = 15.0):
    """A websocket to a server, authenticated by a session cookie (as a browser would be)."""
    from websockets.asyncio.client import connect

    return connect(
        f"ws://127.0.0.1:{port}{path}",
        origin=f"http://127.0.0.1:{port}",
        additional_headers={"Cookie": f"sessionid={session}"},
        open_timeout=timeout,
        close_timeout=2,
        compression=None,
        max_size=2**24,
        proxy=None,
    )


@dataclass
class PendingRun:
    run_id: int
    request_id: str  # the wire id the API takes
    request_pk: int  # the database pk: the inbox row's DOM id is row-<pk>


async def create_pending_runs(
    topo: Topology, token: str, n: int, *, concurrency: int = 8, label: str = "halted runs"
) -> list[PendingRun]:
    """Start n demo runs through POST /api/runs (spread over the servers) and wait until the
    workers have halted every one of them on its refund request (status pending)."""
    import asyncio

    if n <= 0:
        return []
    t0 = time.monotonic()
    clients = [http_client(f"http://127.0.0.1:{s.port}", concurrency) for s in topo.servers]
    headers = {"Authorization": f"Bearer {token}"}
    sem = asyncio.Semaphore(concurrency)
    ids: list[int] = []

    async def one(i: int) -> None:
        async with sem:
            body = {"agent": "demo", "prompt": f"Refund order B-{1000 + i}, ${10 + i % 90}"}
            r = await clients[i % len(clients)].post("/api/runs", json=body, headers=headers)
            if r.status_code != 201:
                raise BenchError(f"POST /api/runs answered {r.status_code}: {r.text[:300]}")
            ids.append(int(r.json()["id"]))

    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        for c in clients:
            await c.aclose()
    posted = time.monotonic() - t0
    deadline = time.monotonic() + 60 + 0.5 * n
    while True:
        counts = dict(
            topo.sql(
                "SELECT status, count(*) FROM approvals_run WHERE id = ANY(%s) GROUP BY status",
                (ids,),
            )
        )
        if counts.get("pending", 0) == n:
            break
        if counts.get("failed") or counts.get("done"):
            raise BenchError(f"pre-created runs did not halt as expected: {counts}")
        if time.monotonic() > deadline:
            raise BenchError(
                f"pre-created runs not all pending after {deadline - t0:.0f} s: {counts}"
            )
        topo.check_alive()
        await asyncio.sleep(0.2)
    rows = topo.sql(
        "SELECT run_id, request_id, id FROM approvals_approvalrequest "
        "WHERE run_id = ANY(%s) AND state = 'pending' ORDER BY run_id",
        (ids,),
    )
    if len(rows) != n:
        raise BenchError(f"expected {n} pending requests, found {len(rows)}")
    took = time.monotonic() - t0
    print(
        f"created {n} {label} in {took:.1f} s (POSTs {posted:.1f} s; "
        f"{n / took:.0f} runs/s started and halted)",
        flush=True,
    )
    return [PendingRun(int(r), str(q), int(p)) for r, q, p in rows]


class LoopLag:
    """How late the client's own event loop wakes up (a busy client inflates every figure)."""

    def __init__(self, tick: float = 0.005) -> None:
        self.tick = tick
        self.samples: list[float] = []
        self._task = None

    async def _run(self) -> None:
        import asyncio

        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.tick)
            self.samples.append((time.perf_counter() - t - self.tick) * 1000)

    def start(self) -> None:
        import asyncio

        self.samples = []
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> list[float]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        return self.samples


class Profiler:
    """py-spy (sampling, --nonblocking) on every server and worker for one phase."""

    def __init__(self, topo: Topology, out_dir: Path, label: str) -> None:
        exe = cpu_breakdown.py_spy()
        if exe is None:
            raise BenchError("--profile needs py-spy: pip install py-spy (into the venv)")
        self.exe = exe
        self.topo = topo
        self.dir = out_dir
        self.label = label
        self.spies: list[tuple[Proc, Path, subprocess.Popen[bytes]]] = []

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in self.topo.servers + self.topo.workers:
            out = self.dir / f"{self.label}-{p.name}.txt"
            cmd = [self.exe, "record", "--pid", str(p.popen.pid), "--format", "raw"]
            cmd += ["--rate", "250", "--nonblocking", "--output", str(out)]
            spy = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
            )
            self.spies.append((p, out, spy))

    def stop(self) -> list[tuple[str, Path]]:
        done = []
        for p, out, spy in self.spies:
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(timeout=20)
            except subprocess.TimeoutExpired:
                spy.kill()
            if out.exists():
                done.append((p.name, out))
            else:
                err = spy.stderr.read().decode(errors="replace") if spy.stderr else ""
                print(f"py-spy wrote nothing for {p.name}: {err.strip()[-300:]}", file=sys.stderr)
        return done


def profile_summary(path: Path, top: int = 8) -> list[str]:
    """Top frames of a py-spy raw (collapsed) profile: leaf time, and inclusive time of the
    project's own functions (approvals/, toolnexus/, bench/)."""
    leaf: dict[str, int] = {}
    incl: dict[str, int] = {}
    roles: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [cpu_breakdown.frame_name(f) for f in stack.split(";") if f]
        role = _thread_role(frames)
        roles[role] = roles.get(role, 0) + n
        if frames:
            leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
        for f in set(frames):
            if any(
                m in f for m in ("approvals/", "toolnexus/", "bench/", "(approvals", "(toolnexus")
            ):
                incl[f] = incl.get(f, 0) + n
    if not total:
        return ["(no samples)"]
    out = [f"{total} samples (busy threads, or waiting on a socket such as PostgreSQL's)"]
    out.append(
        "  by thread: "
        + ", ".join(
            f"{name} {100 * n / total:.0f}%"
            for name, n in sorted(roles.items(), key=lambda kv: -kv[1])
        )
    )
    out.append("  leaf (self) time:")
    for name, n in sorted(leaf.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"    {100 * n / total:5.1f}%  {name}")
    out.append("  inclusive, project code:")
    for name, n in sorted(incl.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"    {100 * n / total:5.1f}%  {name}")
    return out


def _thread_role(frames: list[str]) -> str:
    """Which thread a sample came from, told by the frames it started with."""
    joined = ";".join(frames)
    if "heartbeat (approvals/execution/worker.py)" in joined:
        return "heartbeat"
    if "run_forever (approvals/execution/worker.py)" in joined:
        return "worker loop"
    if "_worker (concurrent/futures/thread.py)" in joined:
        return "thread pool (sync views, db calls, async_to_sync loops)"
    return "main (event loop)"


def require_websockets() -> None:
    try:
        import websockets  # noqa: F401
    except ImportError:
        raise BenchError(
            "the websocket client is missing: pip install websockets "
            "(or pip install -e '.[test]', which lists it)"
        ) from None
