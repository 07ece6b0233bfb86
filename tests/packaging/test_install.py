"""The app as a host project gets it: the wheel built from this checkout, installed into a
fresh virtual environment, a new `startproject`, the README's "Add the inbox to your
project" applied block by block, its commands run, and its example test passing (offline:
tests/packaging/fresh_host.py says how). tests/e2e/test_fresh_project.py drives such a
project in a browser.
"""

from __future__ import annotations

import re
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from .fresh_host import (
    apply_block,
    build_wheel,
    free_port,
    host_env,
    make_venv,
    readme_blocks,
    run,
)

pytestmark = pytest.mark.install


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("build"))


def test_the_wheel_holds_the_engine_and_the_app_not_the_demo_project(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "toolnexus/__init__.py",
        "approvals/apps.py",
        "approvals/migrations/0001_initial.py",
        "approvals/templates/approvals/base.html",
        "approvals/templates/approvals/page.html",
        "approvals/templates/admin/approvals/decline_reason.html",
        "approvals/static/approvals/app.css",
        "approvals/static/approvals/app.js",
        "approvals/testing/pytest_plugin.py",
        "approvals/management/commands/approvals_groups.py",
        "approvals/auth_urls.py",
        "approvals/templates/approvals/login.html",
        "approvals/templates/approvals/signed_out.html",
    ):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("toolnexus_web/", "tests/", "bench/"))]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed (and .venv's dependencies)."""
    return make_venv(wheel, tmp_path_factory.mktemp("venv"))


def test_a_new_project_follows_the_readme(venv, tmp_path):
    python = venv / "bin" / "python"
    env = host_env(venv)
    where = run(
        python,
        "-c",
        "import approvals, toolnexus; print(approvals.__file__); print(toolnexus.__file__)",
        cwd=tmp_path,
        env=env,
    ).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the wheel's, not ours
    missing = run(python, "-c", "import toolnexus_web", cwd=tmp_path, env=env, check=False)
    assert missing.returncode != 0 and "No module named 'toolnexus_web'" in missing.stderr

    run(python, "-m", "django", "startproject", "shop", cwd=tmp_path, env=env)
    project = tmp_path / "shop"
    manage = [python, "manage.py"]

    blocks = readme_blocks()
    assert [lang for lang, _ in blocks].count("python") >= 5, blocks
    commands: list[str] = []
    applied_settings = False
    for language, text in blocks:
        commands += apply_block(project, language, text)
        applied_settings = applied_settings or "shop/settings.py" in text
        if applied_settings and "shop/asgi.py" in text:
            # Settings, URLs and the ASGI application in place: nothing is missing.
            check = run(*manage, "check", cwd=project, env=env)
            assert "System check identified no issues" in check.stdout, check.stdout
            _serve_before_migrate(manage, project, env)
    assert commands == [
        "python manage.py migrate",
        "python manage.py approvals_groups",
        "python -m pytest",
    ], commands

    for command in commands[:-1]:
        done = run(python, *command.split()[1:], cwd=project, env=env)
        assert "Error" not in done.stderr, done.stderr
    with sqlite3.connect(project / "db.sqlite3") as db:
        groups = {name for (name,) in db.execute("select name from auth_group")}
    assert groups == {"Reviewers", "Watchers"}

    _serve(manage, project, env)

    tests = run(
        python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project, env=env, timeout=180
    )
    assert re.search(r"\b2 passed\b", tests.stdout), tests.stdout


def _start_serve(manage, project, env) -> tuple[subprocess.Popen, int, list[str]]:
    port = free_port()
    server = subprocess.Popen(
        [*map(str, manage), "serve", "--no-worker", "--port", str(port)],
        cwd=project,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in server.stdout:
            lines.append(line)
            if "serving on" in line:
                started.set()
        started.set()  # the process ended

    threading.Thread(target=read, daemon=True).start()
    if started.wait(60) and server.poll() is None and _listening(port):
        return server, port, lines
    _stop(server)
    raise AssertionError("serve did not start:\n" + "".join(lines))


def _listening(port: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def _stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _serve_before_migrate(manage, project, env) -> None:
    """serve in a project of one's own: it says migrations are missing and applies none."""
    server, _, lines = _start_serve(manage, project, env)
    _stop(server)
    out = "".join(lines)
    assert "unapplied migration" in out, out
    assert "demo account" not in out, out
    database = project / "db.sqlite3"
    if database.exists():
        with sqlite3.connect(database) as db:
            tables = [name for (name,) in db.execute("select name from sqlite_master")]
        assert not any(t.startswith("approvals_") for t in tables), tables


def _serve(manage, project, env) -> None:
    """serve with the project's own ASGI application: the pages at the README's prefix ask
    for the project's sign-in, the API answers JSON; no demo accounts were made."""
    server, port, lines = _start_serve(manage, project, env)
    try:
        base = f"http://127.0.0.1:{port}"
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            opener.open(f"{base}/approvals/", timeout=10)
            raise AssertionError("the inbox answered an anonymous visitor")
        except urllib.error.HTTPError as exc:
            assert exc.code == 302 and exc.headers["Location"].startswith("/accounts/login/")
        with urllib.request.urlopen(f"{base}/accounts/login/?next=/approvals/", timeout=10) as r:
            assert b"<h1>Sign in</h1>" in r.read()  # the app's sign-in page, not a 404
        try:
            urllib.request.urlopen(f"{base}/approvals/api/runs", timeout=10)
            raise AssertionError("the API answered an anonymous caller")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401 and exc.headers["Content-Type"].startswith("application/json")
        try:
            urllib.request.urlopen(f"{base}/approvals/api/no/such", timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code == 404 and exc.headers["Content-Type"].startswith("application/json")
        with urllib.request.urlopen(f"{base}/static/approvals/app.js", timeout=10) as js:
            assert b"appData" in js.read()
    finally:
        _stop(server)
    out = "".join(lines)
    assert "demo account" not in out and "unapplied" not in out, out
    assert "secret key: the project's SECRET_KEY setting" in out, out
    assert "application: shop.asgi.application (ASGI_APPLICATION is not set" in out, out
    assert "refuses websockets" not in out, out
    with sqlite3.connect(project / "db.sqlite3") as db:
        assert db.execute("select count(*) from auth_user").fetchone() == (0,)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
