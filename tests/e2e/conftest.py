"""Browser tests: Debian's Chromium driven by Playwright against the app run as subprocesses.

The app is started the way an operator starts it, never as a forked live server (see the
fork hazard in the design notes):

- embedded (default): `manage.py serve` on a temp SQLite file; worker thread in the server,
  in-memory channel layer;
- split (`E2E_TOPOLOGY=split`, with `DATABASE_URL` and `REDIS_URL`): a fresh PostgreSQL
  database for this session, `manage.py serve --no-worker` plus a separate
  `manage.py db_worker`, live pushes through Redis.

These tests never touch pytest-django's database: every setup step goes through the browser,
the JSON API, or a `manage.py` subprocess. Screenshots go to `$E2E_ARTIFACTS`
(default `<repo>/artifacts/e2e`, gitignored); the servers' logs are copied there too and
printed when a test failed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "e2e-" + secrets.token_urlsafe(12)
WAIT = 15  # seconds: the longest any single wait may take
START_WAIT = 60  # seconds: an app starting on a loaded machine (a plain serve took 16-20 s there)
FAILED = pytest.StashKey[bool]()
LOGS = pytest.StashKey[list]()

LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


# -- reporting -----------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.config.stash[FAILED] = True
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    logs = config.stash.get(LOGS, [])
    if not logs or not config.stash.get(FAILED, False):
        return
    for name, path in logs:
        terminalreporter.section(f"e2e server log: {name} (last 150 lines)")
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError as exc:
            lines = [f"(could not read {path}: {exc})"]
        for line in lines[-150:]:
            terminalreporter.write_line(line)


# -- the app in subprocesses ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class App:
    base_url: str
    password: str
    env: dict[str, str]
    topology: str
    processes: list[tuple[str, subprocess.Popen, Path]] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.base_url + path

    def manage(self, *args: str) -> str:
        """Run a `manage.py` command against this app's database; its stdout."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def start(self, name: str, args: list[str], logdir: Path) -> subprocess.Popen:
        log = logdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", *args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as one at teardown
            )
        self.processes.append((name, proc, log))
        return proc

    def check_alive(self) -> None:
        for name, proc, log in self.processes:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}:\n{log.read_text(errors='replace')}"
                )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_WAIT
        last: object = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                response = httpx.get(self.url("/accounts/login/"), timeout=2)
                if response.status_code == 200:
                    return
                last = response.status_code
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.1)
        logs = "\n".join(log.read_text(errors="replace") for _, _, log in self.processes)
        raise RuntimeError(
            f"the app did not answer within {START_WAIT} s (last: {last!r}):\n{logs}"
        )

    def stop(self) -> None:
        for _, proc, _ in reversed(self.processes):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for _, proc, _ in reversed(self.processes):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def _psql(url: str, sql: str) -> None:
    parts = urlsplit(url)
    env = {**os.environ}
    if parts.password:
        env["PGPASSWORD"] = parts.password
    subprocess.run(
        [
            "psql",
            "-h",
            parts.hostname or "127.0.0.1",
            "-p",
            str(parts.port or 5432),
            "-U",
            parts.username or "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-qc",
            sql,
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture(scope="session")
def artifacts() -> Path:
    path = Path(os.environ.get("E2E_ARTIFACTS") or ROOT / "artifacts" / "e2e")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _vapid_keys() -> dict[str, str]:
    """A fresh P-256 pair in the settings' forms (as `manage.py vapid_keys` prints them)."""
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def b64url(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    key = ec.generate_private_key(ec.SECP256R1())
    point = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return {
        "TOOLNEXUS_VAPID_PUBLIC_KEY": b64url(point),
        "TOOLNEXUS_VAPID_PRIVATE_KEY": b64url(key.private_numbers().private_value.to_bytes(32)),
    }


@pytest.fixture(scope="session")
def app(tmp_path_factory, artifacts, pytestconfig) -> Iterator[App]:
    topology = os.environ.get("E2E_TOPOLOGY", "embedded")
    workdir = tmp_path_factory.mktemp("e2e-app")
    port = _free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="toolnexus_web.settings",
        TOOLNEXUS_DEMO_PASSWORD=PASSWORD,
        PYTHONUNBUFFERED="1",
        TOOLNEXUS_WORKER_INTERVAL="0.1",
        # The suite starts runs and polls the API faster than a team does: no run cap or API
        # throttle here (tests/approvals/test_throttling.py tests them).
        TOOLNEXUS_RUNS_PER_MINUTE="0",
        TOOLNEXUS_API_TOKEN_RATE="0",
        TOOLNEXUS_API_USER_RATE="0",
        # Chip counts of a live inbox follow within 1 s, not the default 5: the checks wait less.
        TOOLNEXUS_LIVE_CHIP_SECONDS="1",
        # A Web Push key pair: the Notifications page offers push (test_web_push.py).
        **_vapid_keys(),
    )
    database = None
    admin_url = ""
    if topology == "split":
        admin_url = os.environ.get("DATABASE_URL", "")
        redis_url = os.environ.get("REDIS_URL", "")
        if not admin_url.startswith(("postgres://", "postgresql://")) or not redis_url:
            raise RuntimeError("E2E_TOPOLOGY=split needs DATABASE_URL (PostgreSQL) and REDIS_URL")
        database = f"toolnexus_e2e_{secrets.token_hex(4)}"
        _psql(admin_url, f'CREATE DATABASE "{database}"')
        parts = urlsplit(admin_url)
        env["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{database}"))
        env["REDIS_URL"] = redis_url
    elif topology == "embedded":
        env["TOOLNEXUS_SQLITE_PATH"] = str(workdir / "db.sqlite3")
    else:
        raise RuntimeError(f"E2E_TOPOLOGY must be embedded or split, not {topology!r}")

    app = App(f"http://127.0.0.1:{port}", PASSWORD, env, topology)
    pytestconfig.stash[LOGS] = []
    try:
        serve = ["serve", "--port", str(port)]
        app.start("serve", [*serve, "--no-worker"] if topology == "split" else serve, workdir)
        app.wait_ready()
        if topology == "split":
            app.start("db_worker", ["db_worker", "--interval", "0.1"], workdir)
            time.sleep(0.5)
            app.check_alive()
        yield app
    finally:
        app.stop()
        for name, _, log in app.processes:
            kept = artifacts / f"{topology}-{name}.log"
            try:
                shutil.copyfile(log, kept)
            except OSError:
                kept = log
            pytestconfig.stash[LOGS].append((name, kept))
        if database:
            _psql(admin_url, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.fixture(scope="session")
def api(app: App) -> Iterator[httpx.Client]:
    """The JSON API as the `reviewer` demo account (bearer token from `manage.py api_token`)."""
    token = app.manage("api_token", "reviewer", "--name", "e2e").strip().splitlines()[-1]
    with httpx.Client(
        base_url=app.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:
        yield client


# -- the browser ---------------------------------------------------------------------------


# Module scope: Playwright's sync API keeps an event loop running in this thread while it is
# open, and pytest-asyncio tests collected after the browser tests could not start theirs.
@pytest.fixture(scope="module")
def chromium():
    executable = os.environ.get("CHROMIUM") or "/usr/bin/chromium"
    if not Path(executable).exists():
        found = shutil.which("chromium")
        if found is None:
            pytest.skip(f"no Chromium at {executable} (set CHROMIUM); browser tests skipped")
        executable = found
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=10_000)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# A figure a test measured, drawn over the page's top right corner for its screenshot.
FIGURE = """(text) => {
  const label = document.createElement('div');
  label.id = 'e2e-figure';
  label.textContent = text;
  label.style.cssText = 'position:fixed;top:0;right:0;z-index:2147483647;background:#111;'
    + 'color:#fff;font:600 13px/1.4 monospace;padding:4px 8px;border-bottom-left-radius:6px';
  document.body.append(label);
}"""


@pytest.fixture
def shoot(artifacts, request):
    """`shoot(page, "step")` saves a full-page screenshot named after the test and step;
    `figure="..."` draws what the test measured on it, `first_screen=True` keeps it to the
    viewport (what a person sees before scrolling)."""
    name = request.node.name.replace("/", "_").replace("[", "-").replace("]", "")
    topology = os.environ.get("E2E_TOPOLOGY", "embedded")

    def take(page, step: str, *, figure: str = "", first_screen: bool = False) -> Path:
        path = artifacts / f"{topology}-{name}-{step}.png"
        if figure:
            page.evaluate(FIGURE, figure)
        try:
            page.screenshot(path=str(path), full_page=not first_screen)
        finally:
            if figure:
                page.evaluate("() => document.getElementById('e2e-figure')?.remove()")
        return path

    return take


@pytest.fixture
def contexts(chromium):
    """`new(**options)` opens a browser context (one simulated user); all closed after.

    The default viewport is a tall desktop (1280x1000): at 1280x720 the toast announcing a
    new request covers the newest card's Decline button for its 8 s lifetime, which
    `test_a_new_requests_toast_leaves_its_buttons_clickable` checks on its own."""
    opened = []

    def new(**options):
        options.setdefault("viewport", {"width": 1280, "height": 1000})
        context = chromium.new_context(**options)
        context.set_default_timeout(10_000)
        context.set_default_navigation_timeout(WAIT * 1000)
        opened.append(context)
        return context

    yield new
    for context in opened:
        context.close()
