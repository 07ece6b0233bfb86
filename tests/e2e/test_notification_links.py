"""An email's signed Approve link in a real browser (issue 36), against an app of its own
started with TOOLNEXUS_NOTIFICATIONS on and a file mail backend: the reviewer turns email on
on the Notifications page, a request arrives, the delivery worker writes the email, and its
Approve link asks for a sign-in, then for a confirmation, and approves once; the same link
again says it was used."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from .conftest import PASSWORD, WAIT, App, _free_port
from .test_inbox import halted_run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def notifying_app(tmp_path_factory) -> Iterator[tuple[App, Path]]:
    """The embedded topology (as conftest's `app`) on a SQLite file of its own, with
    notifications on and email written to files."""
    workdir = tmp_path_factory.mktemp("e2e-notify")
    mails = workdir / "mail"
    mails.mkdir()
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
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
        TOOLNEXUS_SQLITE_PATH=str(workdir / "db.sqlite3"),
        TOOLNEXUS_NOTIFICATIONS="1",
        TOOLNEXUS_PUBLIC_BASE_URL=base,
        DJANGO_EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        DJANGO_EMAIL_FILE_PATH=str(mails),
    )
    notifying = App(base, PASSWORD, env, "embedded")
    try:
        notifying.start("serve-notify", ["serve", "--port", str(port)], workdir)
        _wait_ready(notifying)
        yield notifying, mails
    finally:
        notifying.stop()


def _wait_ready(app: App, seconds: float = 90) -> None:
    """As App.wait_ready, with room for a fresh database's migrations on a busy machine."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        app.check_alive()
        try:
            if httpx.get(app.url("/accounts/login/"), timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the app did not answer within {seconds} s")


def wait_for_mail(mails: Path) -> str:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = sorted(mails.glob("*.log"))
        if found:
            return found[0].read_text()
        time.sleep(0.2)
    raise AssertionError("no email was written")


def test_an_emailed_approve_link_signs_in_confirms_and_approves_once(
    notifying_app, contexts, shoot
):
    app, mails = notifying_app
    settings_page = contexts().new_page()
    settings_page.goto(app.url("/accounts/login/?next=/notifications/"))
    settings_page.fill("#id_username", "reviewer")
    settings_page.fill("#id_password", app.password)
    settings_page.get_by_role("button", name="Sign in").click()
    settings_page.wait_for_url(app.url("/notifications/"))
    settings_page.get_by_role("checkbox", name="Email").check()
    settings_page.fill("#id_email", "reviewer@example.test")
    settings_page.get_by_role("button", name="Save").click()
    expect(settings_page.get_by_text("Notification settings saved.")).to_be_visible()
    shoot(settings_page, "settings")

    token = app.manage("api_token", "reviewer2", "--name", "e2e-notify").strip().splitlines()[-1]
    with httpx.Client(
        base_url=app.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as api:
        _, request_id = halted_run(api, "Refund order A-3636, $36")
        mail = wait_for_mail(mails)
        assert "demo: refund" in mail and f"/requests/{request_id}/" in mail
        approve = re.search(r"^Approve: (\S+)$", mail, re.M).group(1)
        assert approve.startswith(app.base_url + "/notifications/link/")

        page = contexts().new_page()  # a browser that is not signed in, as a mail client's
        page.goto(approve)
        page.fill("#id_username", "reviewer")
        page.fill("#id_password", app.password)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Approve this request?")).to_be_visible()
        assert api.get(f"/api/requests/{request_id}").json()["state"] == "pending"
        shoot(page, "confirm")
        page.get_by_role("button", name="Yes, approve").click()
        page.wait_for_url(app.url(f"/requests/{request_id}/"))
        expect(page.get_by_text("Approved.").first).to_be_visible()
        request = api.get(f"/api/requests/{request_id}").json()
        assert request["state"] == "approved"

        page.goto(approve)
        expect(page.get_by_role("heading", name="This link was already used")).to_be_visible()
