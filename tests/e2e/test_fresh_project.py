"""A brand-new host project's first hour, in a real browser: the wheel built from this
checkout and installed into a fresh virtual environment, `django-admin startproject shop`,
the README's "Add the inbox to your project" applied as written (no other settings: DEBUG
on, ALLOWED_HOSTS = [], no ASGI_APPLICATION, no LOGIN_URL), an agent in an app of the
project (the README's "Registering your own agents"), a reviewer put in the Reviewers group,
and `manage.py serve`. A reviewer who is not staff signs in, sees the inbox go live, a run
arrives live, and a decline with a reason reaches the model.

Offline and on loopback only (tests/packaging/fresh_host.py says how the wheel and the venv
are made). SQLite whatever E2E_TOPOLOGY says: the split run skips it, since it would only
repeat this.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.packaging.fresh_host import build_wheel, free_port, host_env, make_venv, new_project, run

from .conftest import WAIT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("E2E_TOPOLOGY", "embedded") != "embedded",
        reason="a new project runs on SQLite: the embedded run covers it",
    ),
]

PASSWORD = "a reviewer's own phrase 42"
# The project's agent, offline: a scripted model (the app's testing kit) that asks for a
# refund, then replies with what the tool returned (the reviewer's decline, here).
AGENTS_PY = """\
from approvals import agents
from approvals.testing import ScriptedModel, call
from toolnexus.relay import relay_tool

REFUND = relay_tool(
    "refund",
    "refund an order",
    {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]},
)
model = ScriptedModel(call("refund", order="A-1"), "Refund: {results}", name="support")
agents.register(
    "support",
    model=model.client,
    tools=[REFUND],
    executors={"refund": lambda args: f"refunded {args['order']}"},
    description="customer support",
)
"""
# What "put people in the groups in the admin" does, from the command line.
REVIEWER = (
    "from django.contrib.auth.models import Group, User; "
    f"user = User.objects.create_user('rita', password={PASSWORD!r}); "
    "user.groups.add(Group.objects.get(name='Reviewers'))"
)


@pytest.fixture(scope="module")
def shop(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """The new project, set up by the README: its directory, its Python and environment."""
    work = tmp_path_factory.mktemp("fresh-project")
    venv = make_venv(build_wheel(work), work)
    env = host_env(venv)
    project, commands = new_project(venv, work)
    assert commands[:2] == ["python manage.py migrate", "python manage.py approvals_groups"]
    python = venv / "bin" / "python"
    # An app of the project's own holds its agent (autodiscovered agents.py).
    run(python, "manage.py", "startapp", "support", cwd=project, env=env)
    (project / "support" / "agents.py").write_text(AGENTS_PY)
    settings = project / "shop" / "settings.py"
    settings.write_text(settings.read_text() + '\nINSTALLED_APPS += ["support"]\n')

    check = run(python, "manage.py", "check", cwd=project, env=env)
    assert "System check identified no issues" in check.stdout, check.stdout + check.stderr
    for command in commands[:2]:
        run(python, *command.split()[1:], cwd=project, env=env)
    run(python, "manage.py", "shell", "-c", REVIEWER, cwd=project, env=env)
    return project, python, {**env, "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def served(shop, tmp_path):
    """`python manage.py serve` in the project (loopback, the worker in the server): its
    base URL and the log it writes."""
    project, python, env = shop
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(python), "manage.py", "serve", "--port", str(port)],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"serve exited:\n{log.read_text()}"
            if "serving on" in log.read_text():
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    pass
            assert time.monotonic() < deadline, f"serve did not start:\n{log.read_text()}"
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", log
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=5)


# `contexts` first: without Chromium the test is skipped before the project is built.
def test_a_new_project_declines_a_run_live_in_a_browser(contexts, shoot, served):
    base, log = served
    started = log.read_text()
    assert "secret key: the project's SECRET_KEY setting" in started, started
    assert "application: shop.asgi.application" in started, started

    context = contexts()
    inbox = context.new_page()
    inbox.goto(f"{base}/approvals/")
    # Signed out: the app's own sign-in page, where Django's default LOGIN_URL points.
    expect(inbox).to_have_url(f"{base}/accounts/login/?next=/approvals/")
    inbox.fill("#id_username", "rita")
    inbox.fill("#id_password", PASSWORD)
    inbox.get_by_role("button", name="Sign in").click()
    inbox.wait_for_url(f"{base}/approvals/")
    live = inbox.locator("#live")
    expect(live).to_have_text("live", timeout=WAIT * 1000)  # the socket opened
    shoot(inbox, "1-inbox-live")

    starter = context.new_page()
    starter.goto(f"{base}/approvals/runs/new/")
    starter.select_option("#agent", "support")
    starter.fill("#prompt", "Refund order A-1")
    starter.get_by_role("button", name="Start").click()
    starter.wait_for_url(re.compile(r".*/approvals/runs/\d+/$"))

    row = inbox.locator("#request-rows li.row")
    expect(row).to_have_count(1, timeout=WAIT * 1000)  # arrived over the socket: no reload
    expect(row).to_contain_text("refund")
    row.locator("a.row-link").click()
    card = inbox.locator("article.card")
    expect(card).to_have_count(1)
    reason = "over the refund limit"
    card.locator("textarea[name=reason]").fill(reason)
    card.get_by_role("button", name=re.compile(r"^Decline(?! all)\b")).click()
    expect(row).to_have_count(0)
    expect(live).to_have_text("live")
    shoot(inbox, "2-declined")

    final = starter.locator("section.final")  # the run's page, live too
    expect(final).to_contain_text(
        f"Refund: relay declined for refund: {reason}", timeout=WAIT * 1000
    )
    expect(starter.locator("#live")).to_have_text("live")
    shoot(starter, "3-run-reply")
    assert "refused" not in log.read_text(), log.read_text()  # no socket was turned away

    # A page of another origin is turned away, and the server's output says why (a project
    # with no LOGGING of its own: Python's last-resort handler prints warnings).
    with pytest.raises(InvalidStatus, match="403"):
        connect(
            base.replace("http://", "ws://") + "/approvals/ws/inbox/",
            origin="http://elsewhere.example",
            open_timeout=WAIT,
        )
    deadline = time.monotonic() + WAIT
    while "refused (403)" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    assert "'http://elsewhere.example'" in log.read_text()
