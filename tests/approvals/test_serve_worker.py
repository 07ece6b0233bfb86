"""`manage.py serve`: its worker runs on the server's event loop, and the server stops at once.

Each test starts `serve` as a subprocess on a SQLite file of its own (a copy of one migrated
once; never pytest-django's database). The worker polls once a minute here, so a run that
halts and resumes within seconds was started by the in-process wake-up on enqueue; SIGINT and
SIGTERM must end the process promptly and cleanly (exit status 0, no traceback), the worker
stopped. The server's timeouts (TOOLNEXUS_HTTP_IDLE_TIMEOUT) close a connection that sends
nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "TOOLNEXUS_", "DATABASE_", "REDIS_"))
        and key != "XDG_DATA_HOME"
    }
    env.update(
        DJANGO_SETTINGS_MODULE="toolnexus_web.settings",
        XDG_DATA_HOME=str(tmp_path / "data"),
        TOOLNEXUS_SQLITE_PATH=str(tmp_path / "db.sqlite3"),
        TOOLNEXUS_WORKER_INTERVAL="60",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _wait(check, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)
    return value


@dataclass
class Served:
    proc: subprocess.Popen
    log: Path
    url: str
    env: dict[str, str]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"serve exited ({self.proc.returncode}):\n{self.text()}")
        try:
            return httpx.get(self.url + "/accounts/login/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def token(self, username: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", "api_token", username],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    def stop(self, signum: int) -> float:
        """Send `signum`; how long the process took to exit."""
        started = time.monotonic()
        os.killpg(self.proc.pid, signum)
        self.proc.wait(timeout=WAIT)
        return time.monotonic() - started


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    """A migrated SQLite file, copied for each test (a migration takes seconds)."""
    workdir = tmp_path_factory.mktemp("serve-template")
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=ROOT,
        env=_env(workdir),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return workdir / "db.sqlite3"


@pytest.fixture
def serve(tmp_path, migrated) -> Iterator:
    started: list[Served] = []
    shutil.copyfile(migrated, tmp_path / "db.sqlite3")

    def start(**extra: str) -> Served:
        port = _free_port()
        log = tmp_path / f"serve-{port}.log"
        env = _env(tmp_path, **extra)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "serve", "--port", str(port)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        served = Served(proc, log, f"http://127.0.0.1:{port}", env)
        started.append(served)
        _wait(served.answers, "serve to answer")
        return served

    yield start
    for served in started:
        if served.proc.poll() is None:
            os.killpg(served.proc.pid, signal.SIGKILL)
            served.proc.wait(timeout=10)


def test_the_worker_in_serve_runs_and_resumes_and_sigterm_stops_it_at_once(serve):
    served = serve()
    api = httpx.Client(
        base_url=served.url,
        headers={"Authorization": f"Bearer {served.token('reviewer')}"},
        timeout=10,
    )
    with api:
        created = api.post("/api/runs", json={"agent": "demo", "prompt": "Refund order A-7007, $7"})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]

        def status(wanted: str):
            body = api.get(f"/api/runs/{run_id}").json()
            return body if body["status"] == wanted else None

        pending = _wait(lambda: status("pending"), "the run to halt", timeout=10)
        request_id = pending["pending"]["request"]["id"]
        approved = api.post(f"/api/requests/{request_id}/approve", json={})
        assert approved.status_code == 200, approved.text
        done = _wait(lambda: status("done"), "the run to finish", timeout=10)
        assert "A-7007" in done["text"]

    assert served.stop(signal.SIGTERM) < 10
    assert served.proc.returncode == 0, served.text()
    log = served.text()
    assert "started" in log and " stopped" in log, log
    assert "Traceback" not in log, log


def test_an_idle_connection_is_closed_and_sigint_stops_serve_at_once(serve):
    served = serve(TOOLNEXUS_HTTP_IDLE_TIMEOUT="1")
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server hung up on a client that sent nothing
        assert time.monotonic() - started < 8

    assert served.stop(signal.SIGINT) < 10
    assert served.proc.returncode == 0, served.text()
    assert "Traceback" not in served.text(), served.text()


def test_a_request_head_sent_a_line_at_a_time_is_cut_off_at_the_header_deadline(serve):
    """One header line every half second keeps the idle timer from firing; the head's own
    deadline ends the connection. A kept-alive connection's next request gets a new one."""
    served = serve(TOOLNEXUS_HTTP_HEADER_TIMEOUT="2", TOOLNEXUS_HTTP_IDLE_TIMEOUT="1")
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /api/openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        for n in range(40):  # 20 s at most
            time.sleep(0.5)
            try:
                sock.sendall(f"X-Slow-{n}: 1\r\n".encode())
            except OSError:
                closed = True
                break
        if not closed:
            sock.settimeout(5)
            with contextlib.suppress(OSError):
                closed = sock.recv(1) == b""
        assert closed, "the server kept a trickling request head open"
        assert time.monotonic() - started < 10

    # whole requests on one kept-alive connection, each well within the deadline, for longer
    # in all than the deadline: each request's head gets a deadline of its own
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for _ in range(4):
            sock.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _read_response(sock).startswith(b"HTTP/1.1 401")
            time.sleep(0.8)  # less than the idle timeout each time, 3.2 s in all


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (its head, and its body by Content-Length) off a kept-alive socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        body += chunk
    return head
