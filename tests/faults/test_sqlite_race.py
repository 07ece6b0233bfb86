"""Twenty reviewers decline one request at once on SQLite, against a real server process.

The embedded default must answer a race the way PostgreSQL does: exactly one 200, and every
loser a 409 naming the winner, never a 503 "database unavailable". The app is started the
way a user starts it (`manage.py serve`, worker in the server) on a temp SQLite file of its
own, named both ways the settings accept one: `TOOLNEXUS_SQLITE_PATH` and
`DATABASE_URL=sqlite:///...`. Each trial races a freshly halted request.

Skipped when DATABASE_URL is set (CI's PostgreSQL pass); PostgreSQL races are covered by
test_reviewer_race.py.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from .conftest import ROOT, free_port, wait_for

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")),
        reason="SQLite only: DATABASE_URL is set (PostgreSQL races: test_reviewer_race.py)",
    ),
]

DECIDERS = 20
TRIALS = 3
REVIEWERS = ("reviewer", "reviewer2")  # demo accounts that may decide


@dataclass
class App:
    base_url: str
    tokens: dict[str, str]
    log: Path

    def client(self, user: str = "reviewer") -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.tokens[user]}"},
            timeout=30,
        )

    def database_errors(self) -> dict[str, int]:
        """The server log's database errors (approvals.api logs each 503), counted."""
        lines = self.log.read_text(errors="replace").splitlines()
        return dict(Counter(line for line in lines if line.startswith("django.db.utils.")))


def _env(tmp: Path, how: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TOOLNEXUS_", "DJANGO_", "DATABASE_"))
        and key not in ("REDIS_URL", "PYTEST_CURRENT_TEST")
    }
    path = tmp / "app.sqlite3"
    if how == "sqlite-url":
        env["DATABASE_URL"] = f"sqlite:///{path}"
    else:
        env["TOOLNEXUS_SQLITE_PATH"] = str(path)
    env.update(
        DJANGO_SETTINGS_MODULE="toolnexus_web.settings",
        TOOLNEXUS_DEMO_PASSWORD="race-" + secrets.token_urlsafe(9),
        PYTHONUNBUFFERED="1",
    )
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _ready(app_url: str, proc: subprocess.Popen, log: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"serve exited with {proc.returncode}:\n{log.read_text()}")
    try:
        return httpx.get(f"{app_url}/api/openapi.json", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module", params=["sqlite-path", "sqlite-url"])
def app(request, tmp_path_factory) -> Iterator[App]:
    """`manage.py serve` on a fresh SQLite file, named by TOOLNEXUS_SQLITE_PATH or by
    DATABASE_URL=sqlite:///..., with API tokens for the two demo reviewers."""
    tmp = tmp_path_factory.mktemp(f"sqlite-race-{request.param}")
    env = _env(tmp, request.param)
    port = free_port()
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one below
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(base_url, proc, log), "the server to answer", timeout=60)
        tokens = {user: _manage(env, "api_token", user).strip() for user in REVIEWERS}
        yield App(base_url=base_url, tokens=tokens, log=log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _halted_request(app: App) -> tuple[int, str]:
    """A fresh demo refund run halted on its request: (run id, request id)."""
    with app.client() as api:
        response = api.post(
            "/api/runs", json={"agent": "demo", "prompt": "Refund order A-1001, $250"}
        )
        assert response.status_code == 201, response.text
        run_id = response.json()["id"]

        def pending() -> str | None:
            run = api.get(f"/api/runs/{run_id}").json()
            assert run["status"] not in ("failed", "cancelled", "done"), run
            return run["pending"]["request"]["id"] if run["status"] == "pending" else None

        return run_id, wait_for(pending, f"run {run_id} to halt")


def _race(app: App, request_id: str) -> list[tuple[str, int, str]]:
    """DECIDERS threads decline the request at once; [(user, status, detail)]."""
    barrier = threading.Barrier(DECIDERS)
    results: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def decline(index: int) -> None:
        user = REVIEWERS[index % len(REVIEWERS)]
        with app.client(user) as api:
            barrier.wait(timeout=30)
            response = api.post(f"/api/requests/{request_id}/decline", json={"reason": "x"})
        detail = response.json().get("detail", "") if response.status_code != 200 else ""
        with lock:
            results.append((user, response.status_code, detail))

    threads = [threading.Thread(target=decline, args=(i,)) for i in range(DECIDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_twenty_declines_of_one_request_on_sqlite_one_wins_every_loser_gets_409(app):
    for trial in range(TRIALS):
        run_id, request_id = _halted_request(app)
        results = _race(app, request_id)

        statuses = Counter(status for _, status, _ in results)
        assert statuses == {200: 1, 409: DECIDERS - 1}, (
            f"trial {trial}: {dict(statuses)}; {[r for r in results if r[1] != 409][:3]}; "
            f"server log: {app.database_errors()}"
        )
        (winner,) = [user for user, status, _ in results if status == 200]
        for _, _, detail in (r for r in results if r[1] == 409):
            assert f"{request_id} was already declined by {winner}" in detail, detail

        with app.client() as api:
            request = api.get(f"/api/requests/{request_id}").json()
            decision = request["decision"] or {}
            assert (request["state"], decision.get("decided_by")) == ("declined", winner), request
            # The one decline resumes the run once: the model reads it and the run finishes.
            wait_for(
                lambda run=f"/api/runs/{run_id}": api.get(run).json()["status"] == "done",
                f"run {run_id} to finish after the decline",
            )
