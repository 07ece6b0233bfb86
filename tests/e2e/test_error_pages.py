"""The 404 and 500 pages on a phone (390 x 844), in light and dark mode: no sideways
scrolling, the app's stylesheet, a way back to the inbox, no CSP violation.

The session's `app` runs with DEBUG on, where Django answers a missing page with its
technical 404 page instead of the project's handler404: these tests start the app as it is
deployed instead, DEBUG off, with its hashed static files collected into a directory of
their own (plain HTTP on loopback)."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from .conftest import LOGS, PASSWORD, App, _free_port

pytestmark = pytest.mark.e2e

PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}

# The 500 page exactly as the running app's handler renders it (DEBUG off, the stylesheet's
# hashed URL from the collected manifest); a real server error would need a broken app.
RENDER_500 = (
    "from django.test import RequestFactory; from approvals.web.views import server_error; "
    "print(server_error(RequestFactory().get('/runs/1/')).content.decode())"
)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, artifacts, pytestconfig) -> Iterator[App]:
    workdir = tmp_path_factory.mktemp("e2e-error-pages")
    port = _free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")
        and not key.startswith("DJANGO_")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="toolnexus_web.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECURE_COOKIES="0",  # plain HTTP on loopback: no redirect to HTTPS
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_STATIC_ROOT=str(workdir / "static"),
        TOOLNEXUS_SQLITE_PATH=str(workdir / "db.sqlite3"),
        TOOLNEXUS_DEMO_PASSWORD=PASSWORD,
        PYTHONUNBUFFERED="1",
    )
    app = App(f"http://127.0.0.1:{port}", PASSWORD, env, "deployed")
    try:
        app.manage("collectstatic", "--noinput", "--verbosity", "0")
        app.start("serve", ["serve", "--port", str(port)], workdir)
        app.wait_ready()
        yield app
    finally:
        app.stop()
        topology = os.environ.get("E2E_TOPOLOGY", "embedded")
        for name, _, log in app.processes:
            kept = artifacts / f"{topology}-error-pages-{name}.log"
            try:
                kept.write_bytes(log.read_bytes())
            except OSError:
                kept = log
            pytestconfig.stash.setdefault(LOGS, []).append((f"error pages: {name}", kept))


def csp_violations(page: Page) -> list[str]:
    """The console's CSP reports from now on (the list fills as the page runs)."""
    found: list[str] = []

    def console(message) -> None:
        if "Content Security Policy" in message.text:
            found.append(message.text)

    page.on("console", console)
    return found


def luminance(page: Page, selector: str) -> float:
    rgb = page.evaluate(
        "s => getComputedStyle(document.querySelector(s)).backgroundColor", selector
    )
    r, g, b = (int(x) for x in re.findall(r"\d+", rgb)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def fits_the_phone(page: Page) -> None:
    wide = page.evaluate(
        "() => Array.from(document.querySelectorAll('body *')).filter(e => e.getBoundingClientRect().right > 391)"
        ".slice(0, 8).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, wide
    # readable: the text at the app's size, not a desktop page shrunk to fit
    # (without a viewport meta a phone lays the page out 980 px wide and shows it at 0.4)
    size = page.locator("main p").first.evaluate(
        "p => parseFloat(getComputedStyle(p).fontSize) * window.visualViewport.scale"
    )
    assert size >= 15, f"the text shows at {size:.1f} px"


def test_a_missing_page_on_a_phone(deployed, contexts, shoot):
    page = contexts(**PHONE).new_page()
    violations = csp_violations(page)
    response = page.goto(deployed.url("/no-such-page/"))
    assert response is not None and response.status == 404
    assert "content-security-policy" in response.headers
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    expect(page.locator("main")).to_contain_text("nothing at this address")
    back = page.get_by_role("link", name="Back to the inbox")
    expect(back).to_be_visible()
    expect(page.locator("header.top")).to_be_visible()  # the app's look: its stylesheet loaded
    fits_the_phone(page)
    assert luminance(page, "body") > 0.8
    shoot(page, "404-light")

    page.emulate_media(color_scheme="dark")
    assert luminance(page, "body") < 0.2
    shoot(page, "404-dark")
    assert violations == []

    back.click()  # signed out: the inbox asks to sign in first
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))


def test_the_server_error_page_on_a_phone(deployed, contexts, shoot):
    html = deployed.manage("shell", "--no-imports", "-c", RENDER_500)
    assert re.search(r'href="/static/approvals/app\.[0-9a-f]{12}\.css"', html), html
    page = contexts(**PHONE).new_page()
    violations = csp_violations(page)
    page.route(
        deployed.url("/runs/1/"),
        lambda route: route.fulfill(status=500, content_type="text/html", body=html),
    )
    response = page.goto(deployed.url("/runs/1/"))
    assert response is not None and response.status == 500
    expect(page.get_by_role("heading", name="Something went wrong")).to_be_visible()
    back = page.get_by_role("link", name="Back to the inbox")
    expect(back).to_have_attribute("href", "/")
    fits_the_phone(page)
    assert luminance(page, "body") > 0.8
    shoot(page, "500-light")

    page.emulate_media(color_scheme="dark")
    assert luminance(page, "body") < 0.2
    shoot(page, "500-dark")
    assert violations == []
