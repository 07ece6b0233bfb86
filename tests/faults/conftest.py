"""Fault tests: the app run as real processes against PostgreSQL and Redis, then broken.

Skipped (with the reason) unless DATABASE_URL points at PostgreSQL and REDIS_URL is set; CI
sets both. Every process is started the way an operator starts it: ASGI servers with
`manage.py serve --no-worker --no-demo-accounts --port P` and workers with
`manage.py db_worker`, with DEBUG off, a 3 s run lease and a 0.5 s maintenance pass so a dead
worker's runs are taken over within seconds. The fault-injection agent
(`tests/faults/agents.py`) is loaded into each through `TOOLNEXUS_AGENT_MODULES`.

Isolation from other developers on the same machine:

- a template database `toolnexus_faults_<hex>_tpl` is migrated once per session (with 50
  reviewers, their API tokens and a browser session) and every test module gets its own
  fresh copy `toolnexus_faults_<hex>`; all are dropped afterwards (the shared `test`
  database and the database DATABASE_URL names are never touched);
- the Redis database REDIS_URL names is flushed at the start of each module (use a number of
  your own, e.g. redis://127.0.0.1:6379/7); the Redis outage test runs its own redis-server;
- ports are free ones picked at start; each process runs in its own session and is SIGKILLed
  by process group at teardown. The tests read and seed their database through the ORM on a
  connection alias of their own (`stack.alias`), never pytest-django's test database.

Each test is bounded (every wait has a deadline; SIGALRM stops a test after TEST_LIMIT s);
when one fails, the tails of the app's process logs are attached to its report.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
WAIT = 20.0  # seconds: the longest a single wait may take
TEST_LIMIT = 150  # seconds: a test still running after this is stopped
LEASE_SECONDS = 3
MAINTENANCE_SECONDS = 0.5
REVIEWERS = 50
EFFECTS = "effects.log"
# One key for every process of the session: sessions made in the template stay valid.
SECRET_KEY = "faults-" + secrets.token_hex(24)
_ACTIVE: list[Stack] = []


# -- whether the services are there ---------------------------------------------------------


def services() -> tuple[str, str, str]:
    """(DATABASE_URL, REDIS_URL, why the fault tests cannot run or "")."""
    db_url = os.environ.get("DATABASE_URL", "")
    redis_url = os.environ.get("REDIS_URL", "")
    if not db_url.startswith(("postgres://", "postgresql://", "pgsql://")):
        return db_url, redis_url, "fault tests need DATABASE_URL pointing at PostgreSQL"
    if not redis_url.startswith(("redis://", "rediss://")):
        return db_url, redis_url, "fault tests need REDIS_URL (redis://host:port/db)"
    return db_url, redis_url, ""


def _runs_the_app(item) -> bool:
    """A test of this directory that runs the app as processes (it uses `stack`); the
    directory's in-process tests need neither PostgreSQL nor Redis."""
    return "stack" in getattr(item, "fixturenames", ()) and Path(
        item.path
    ).resolve().is_relative_to(HERE)


def pytest_collection_modifyitems(config, items):
    *_, why = services()
    if not why:
        return
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if _runs_the_app(item):
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and _ACTIVE and _runs_the_app(item):
        for stack in _ACTIVE:
            for proc in stack.procs:
                report.sections.append((f"app log: {proc.name} (last 60 lines)", proc.tail(60)))
    return report


@pytest.fixture(autouse=True)
def _time_limit(request):
    if not _runs_the_app(request.node):
        yield
        return

    def expired(signum, frame):
        raise TimeoutError(f"fault test still running after {TEST_LIMIT} s: stopped")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_LIMIT)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# -- small helpers -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def admin_sql(db_url: str, sql: str) -> None:
    """Run one statement on the server's `postgres` database (CREATE/DROP DATABASE)."""
    import psycopg

    with psycopg.connect(with_database(db_url, "postgres"), autocommit=True) as conn:
        conn.execute(sql)


def wait_for(
    check: Callable[[], Any], what: str, *, timeout: float = WAIT, every: float = 0.1
) -> Any:
    """Poll `check` until it returns something truthy (returned); fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def base_env(db_url: str, redis_url: str, workdir: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TOOLNEXUS_", "DJANGO_", "DATABASE_"))
        and key not in ("REDIS_URL", "PYTEST_CURRENT_TEST")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="toolnexus_web.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=SECRET_KEY,
        DJANGO_SECURE_COOKIES="0",
        DATABASE_URL=db_url,
        REDIS_URL=redis_url,
        TOOLNEXUS_AGENT_MODULES="tests.faults.agents",
        # Faults start runs and poll faster than a team: throttles are tested elsewhere.
        TOOLNEXUS_RUNS_PER_MINUTE="0",
        TOOLNEXUS_API_TOKEN_RATE="0",
        TOOLNEXUS_API_USER_RATE="0",
        TOOLNEXUS_FAULTS_DIR=str(workdir),
        TOOLNEXUS_RUN_LEASE_SECONDS=str(LEASE_SECONDS),
        TOOLNEXUS_MAINTENANCE_SECONDS=str(MAINTENANCE_SECONDS),
        # Every task row kept: the tests count the tasks each run had (tasks_for).
        TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS="86400",
        TOOLNEXUS_WORKER_INTERVAL="0.1",
        TOOLNEXUS_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


# Run in `manage.py shell`: the reviewers, their API tokens and one browser session.
SETUP_SCRIPT = """
import json, os
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from approvals import services
from approvals.permissions import ensure_groups
groups = ensure_groups()
User = get_user_model()
tokens = {}
for i in range(int(os.environ["FAULTS_REVIEWERS"])):
    user = User.objects.create_user(username=f"rev{i:02d}")
    user.groups.add(groups["Reviewers"])
    tokens[user.username] = services.api_token_create(user=user, name="faults")[0]
user = User.objects.get(username="rev00")
store = SessionStore()
store[SESSION_KEY] = str(user.pk)
store[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
store[HASH_SESSION_KEY] = user.get_session_auth_hash()
store.create()
print("FAULTS-SETUP " + json.dumps({"tokens": tokens, "session": store.session_key}))
"""


# -- the app as processes ------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"

    def tail(self, lines: int) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def kill9(self) -> int:
        """SIGKILL the process (and anything it started); its exit status."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.wait(timeout=10)


@dataclass
class Stack:
    """One fresh database (plus a Redis URL) and the app processes run against it."""

    db_name: str
    db_url: str
    redis_url: str
    workdir: Path
    tokens: dict[str, str]
    session: str
    procs: list[Proc] = field(default_factory=list)

    @property
    def alias(self) -> str:
        return f"faults_{self.db_name}"

    def env(self, **extra: str) -> dict[str, str]:
        return {**base_env(self.db_url, self.redis_url, self.workdir), **extra}

    # processes

    def launch(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed as one
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def spawn(self, name: str, args: list[str], **extra_env: str) -> Proc:
        return self.launch(name, [sys.executable, "manage.py", *args], self.env(**extra_env))

    def redis_server(self, port: int) -> Proc:
        """A redis-server of this test's own (never the machine's shared one)."""
        import redis

        proc = self.launch(
            f"redis-{port}-{len(self.procs)}",
            [
                *f"redis-server --port {port} --bind 127.0.0.1 --appendonly no".split(),
                *["--daemonize", "no", "--save", "", "--dir", str(self.workdir)],
            ],
            dict(os.environ),
        )
        proc.port = port

        def pong() -> bool:
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited:\n{proc.text()}")
            try:
                with contextlib.closing(redis.Redis(port=port, socket_timeout=1)) as client:
                    return bool(client.ping())
            except redis.RedisError:
                return False

        wait_for(pong, f"redis-server on port {port}")
        return proc

    def start_server(self, *, port: int | None = None, **extra_env: str) -> Proc:
        """Start one ASGI server without waiting (see `ready`)."""
        port = port or free_port()
        proc = self.spawn(
            f"server-{port}-{len(self.procs)}",
            ["serve", "--no-worker", "--no-demo-accounts", "--port", str(port)],
            **extra_env,
        )
        proc.port = port
        return proc

    def ready(self, proc: Proc, timeout: float = WAIT) -> Proc:
        def answers() -> bool:
            if not proc.alive():
                raise AssertionError(
                    f"{proc.name} exited ({proc.popen.returncode}):\n{proc.text()}"
                )
            try:
                return httpx.get(proc.url + "/api/requests", timeout=2).status_code == 401
            except httpx.HTTPError:
                return False

        wait_for(answers, f"{proc.name} to answer HTTP", timeout=timeout)
        return proc

    def server(self, *, port: int | None = None, **extra_env: str) -> Proc:
        return self.ready(self.start_server(port=port, **extra_env))

    def servers(self, count: int, **extra_env: str) -> list[Proc]:
        started = [self.start_server(**extra_env) for _ in range(count)]
        return [self.ready(p) for p in started]

    def worker(self, *, interval: str = "0.1", **extra_env: str) -> Proc:
        proc = self.spawn(
            f"worker-{len(self.procs)}", ["db_worker", "--interval", interval], **extra_env
        )

        def running() -> bool:
            if not proc.alive():
                raise AssertionError(
                    f"{proc.name} exited ({proc.popen.returncode}):\n{proc.text()}"
                )
            return " running (Ctrl+C to stop)" in proc.text()

        wait_for(running, f"{proc.name} to start")
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                proc.kill9()

    # the HTTP API

    def client(self, server: Proc, user: str = "rev00", **kwargs: Any) -> httpx.Client:
        return httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {self.tokens[user]}"},
            timeout=kwargs.pop("timeout", 15),
            **kwargs,
        )

    def async_client(self, server: Proc, user: str = "rev00", **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=server.url,
            headers={"Authorization": f"Bearer {self.tokens[user]}"},
            timeout=kwargs.pop("timeout", 30),
            **kwargs,
        )

    # the database

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.db_url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def terminate_backends(self) -> int:
        """Kill every other connection to this database, from the server side."""
        rows = self.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (self.db_name,),
        )
        return sum(1 for (ok,) in rows if ok)

    def db(self) -> str:
        """The ORM alias on this database, on a fresh connection (backends may have been
        terminated since the last use)."""
        from django.db import connections

        connections[self.alias].close()
        return self.alias

    def open_orm(self) -> None:
        import dj_database_url
        from django.db import DEFAULT_DB_ALIAS, connections

        configured = connections.configure_settings(
            {
                DEFAULT_DB_ALIAS: dict(connections.settings[DEFAULT_DB_ALIAS]),
                self.alias: dj_database_url.parse(self.db_url, conn_health_checks=True),
            }
        )
        connections.settings[self.alias] = configured[self.alias]

    def close_orm(self) -> None:
        from django.db import connections

        with contextlib.suppress(Exception):
            connections[self.alias].close()
        with contextlib.suppress(AttributeError, KeyError):
            del connections[self.alias]
        connections.settings.pop(self.alias, None)

    # side effects recorded by the faults agent

    def effects(self) -> Counter[tuple[str, str]]:
        path = self.workdir / EFFECTS
        lines = path.read_text().splitlines() if path.exists() else []
        return Counter((line.split()[0], line.split()[1]) for line in lines if line.strip())

    def marker(self, name: str) -> Path:
        return self.workdir / name

    # runs and requests

    def run_row(self, run_id: int):
        from approvals.models import Run

        return Run.objects.using(self.db()).get(pk=run_id)

    def wait_status(self, run_id: int, statuses: set[str], timeout: float = WAIT):
        from approvals.models import Run

        alias = self.db()

        def reached():
            run = Run.objects.using(alias).get(pk=run_id)
            return run if run.status in statuses else None

        try:
            return wait_for(reached, f"run {run_id} to reach {sorted(statuses)}", timeout=timeout)
        except AssertionError as exc:
            run = Run.objects.using(alias).get(pk=run_id)
            raise AssertionError(f"{exc}; it is {run.status} (error: {run.error!r})") from None

    def clone_pending(self, run_id: int, count: int, prefix: str) -> list[tuple[int, str, str]]:
        """`count` more runs halted exactly like the pending run `run_id`, each with its own
        tag in its prompt, transcript and call inputs: [(run pk, request id, tag)]."""
        from django.db import transaction

        from approvals.models import ApprovalRequest, Event, RequestCall, Run

        from .agents import parse

        alias = self.db()
        src = Run.objects.using(alias).get(pk=run_id)
        req = ApprovalRequest.objects.using(alias).get(run_id=run_id, state="pending")
        calls = list(RequestCall.objects.using(alias).filter(request=req).order_by("position"))
        old = parse(src.prompt)["tag"]

        def swap(value: Any, tag: str) -> Any:
            return json.loads(json.dumps(value).replace(old, tag))

        tags = [f"{prefix}{i:04d}" for i in range(count)]
        with transaction.atomic(using=alias):
            runs = Run.objects.using(alias).bulk_create(
                Run(
                    agent=src.agent,
                    prompt=src.prompt.replace(old, tag),
                    system_prompt=src.system_prompt,
                    status=Run.Status.PENDING,
                    messages=swap(src.messages, tag),
                    turns=src.turns,
                    usage=src.usage,
                    attempts=src.attempts,
                    started_by_id=src.started_by_id,
                    version=src.version,
                )
                for tag in tags
            )
            reqs = ApprovalRequest.objects.using(alias).bulk_create(
                ApprovalRequest(
                    run=run,
                    agent=req.agent,
                    request_id=f"{req.request_id}-{tag}",
                    kind=req.kind,
                    prompt=req.prompt,
                    url=req.url,
                    data=swap(req.data, tag),
                )
                for run, tag in zip(runs, tags, strict=True)
            )
            RequestCall.objects.using(alias).bulk_create(
                RequestCall(
                    request=row,
                    position=call.position,
                    call_id=call.call_id,
                    tool_name=call.tool_name,
                    input=swap(call.input, tag),
                    arguments=call.arguments.replace(old, tag),
                )
                for row, tag in zip(reqs, tags, strict=True)
                for call in calls
            )
            Event.objects.using(alias).bulk_create(
                Event(
                    run=run,
                    request=row,
                    action="request_created",
                    to_state="pending",
                    detail={"cloned_from": run_id},
                )
                for run, row in zip(runs, reqs, strict=True)
            )
        return [(r.pk, q.request_id, t) for r, q, t in zip(runs, reqs, tags, strict=True)]


def tasks_for(stack: Stack, run_ids: list[int]) -> Counter[int]:
    """How many task rows (any status) drive each run."""
    from django_tasks_db.models import DBTaskResult

    counts: Counter[int] = Counter()
    for args_kwargs in DBTaskResult.objects.using(stack.db()).values_list("args_kwargs", flat=True):
        args = args_kwargs.get("args") or []
        if len(args) == 1 and args[0] in run_ids:
            counts[args[0]] += 1
    return counts


def start_run(client: httpx.Client, prompt: str, agent: str = "faults") -> int:
    response = client.post("/api/runs", json={"agent": agent, "prompt": prompt})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def pending_request_id(stack: Stack, run_id: int) -> str:
    from approvals.models import ApprovalRequest

    stack.wait_status(run_id, {"pending"})
    return ApprovalRequest.objects.using(stack.db()).get(run_id=run_id, state="pending").request_id


def assert_balanced(messages: list[dict[str, Any]]) -> None:
    """Every tool call answered exactly once, right after its assistant turn; ends with a
    final reply."""
    answered = 0
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and message.get("tool_calls"):
            ids = [tc["id"] for tc in message["tool_calls"]]
            following = []
            for later in messages[index + 1 :]:
                if later.get("role") != "tool":
                    break
                following.append(later.get("tool_call_id"))
            assert sorted(following) == sorted(ids), (index, ids, following)
            answered += len(following)
    assert answered == sum(1 for m in messages if m.get("role") == "tool"), messages
    last = messages[-1]
    assert last.get("role") == "assistant" and not last.get("tool_calls"), last


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def template_db(tmp_path_factory) -> Iterator[tuple[str, dict[str, Any]]]:
    """A migrated database with the reviewers, their tokens and a session; each module
    copies it (CREATE DATABASE ... TEMPLATE), which takes a fraction of a migration."""
    db_url, redis_url, why = services()
    if why:
        pytest.skip(why)
    name = f"toolnexus_faults_{secrets.token_hex(4)}_tpl"
    admin_sql(db_url, f'CREATE DATABASE "{name}"')
    try:
        env = base_env(with_database(db_url, name), redis_url, tmp_path_factory.mktemp("tpl"))
        env["FAULTS_REVIEWERS"] = str(REVIEWERS)
        manage(env, "migrate", "--verbosity", "0")
        out = manage(env, "shell", "--verbosity", "0", "-c", SETUP_SCRIPT)
        line = next(x for x in out.splitlines() if x.startswith("FAULTS-SETUP "))
        yield name, json.loads(line.removeprefix("FAULTS-SETUP "))
    finally:
        admin_sql(db_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def stack(template_db, tmp_path_factory, django_db_blocker) -> Iterator[Stack]:
    """A fresh database for this module (a copy of the template), the module's Redis
    database flushed, and a work directory for logs, markers and recorded side effects."""
    import redis

    db_url, redis_url, _ = services()
    template, setup = template_db
    name = f"toolnexus_faults_{secrets.token_hex(4)}"
    admin_sql(db_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        client.flushdb()
    made = Stack(
        db_name=name,
        db_url=with_database(db_url, name),
        redis_url=redis_url,
        workdir=tmp_path_factory.mktemp("faults"),
        tokens=setup["tokens"],
        session=setup["session"],
    )
    _ACTIVE.append(made)
    try:
        with django_db_blocker.unblock():
            made.open_orm()
            try:
                yield made
            finally:
                made.stop()
                made.close_orm()
    finally:
        _ACTIVE.remove(made)
        admin_sql(db_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
