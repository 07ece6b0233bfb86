"""The Content-Security-Policy in a real browser: every page a reviewer or an administrator
uses, live socket and htmx swaps included, runs without a single violation, and the policy
is strict (no inline script or style, no eval) on every page."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .conftest import WAIT
from .test_inbox import BUTTON, card_of, halted_run, login, open_inbox, tag, wait_run

pytestmark = pytest.mark.e2e

# Runs before any of the page's scripts, in every page and frame of the context.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", function (e) {
  window.__reportCsp({
    page: location.pathname,
    directive: e.effectiveDirective || e.violatedDirective,
    blocked: e.blockedURI,
    source: (e.sourceFile || "") + ":" + e.lineNumber,
    sample: e.sample || "",
  });
}, true);
"""


# What app.js's "Reload it" does: the card again, swapped in place of itself (same ids).
RELOAD_CARD = """id => {
  const card = document.querySelector('#detail article.card');
  const root = document.querySelector('.approvals-app').dataset.appRoot;
  htmx.ajax('GET', root + 'requests/' + encodeURIComponent(id) + '/card/', { target: card, swap: 'outerHTML' })
    .then(() => { window.__reloaded = 1; });
}"""


def _directives(policy: str) -> dict[str, list[str]]:
    parts = [p.strip().split() for p in policy.split(";") if p.strip()]
    return {p[0]: p[1:] for p in parts}


class Watch:
    """Browser contexts that report every CSP violation (event and console) and record the
    policy each page was served with."""

    def __init__(self, contexts):
        self._contexts = contexts
        self.violations: list[dict] = []
        self.documents: list[tuple[str, str | None]] = []

    def context(self, **options):
        context = self._contexts(**options)
        context.expose_binding("__reportCsp", lambda _source, v: self.violations.append(v))
        context.add_init_script(REPORT_VIOLATIONS)
        context.on("console", self._console)
        context.on("response", self._response)
        return context

    def _console(self, message) -> None:
        if "Content Security Policy" in message.text:
            self.violations.append({"console": message.text})

    def _response(self, response) -> None:
        if response.request.resource_type == "document":
            self.documents.append((response.url, response.headers.get("content-security-policy")))

    def settle(self, page) -> None:
        """Give late reports (a push, a swap) a moment to arrive."""
        page.wait_for_timeout(300)

    def assert_clean(self) -> None:
        assert self.violations == [], "\n".join(map(str, self.violations))
        assert self.documents, "no page was loaded"
        for url, policy in self.documents:
            assert policy, f"{url} was served without a Content-Security-Policy"
            directives = _directives(policy)
            assert directives.get("script-src") == ["'self'"], (url, policy)
            assert directives.get("style-src") == ["'self'"], (url, policy)
            assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy, url


@pytest.fixture
def watch(contexts) -> Watch:
    return Watch(contexts)


def test_the_violation_listener_reports_what_the_policy_blocks(app, watch):
    """The check below is only as good as its listener: an inline script is blocked and
    reported, and htmx runs with eval off."""
    page = watch.context().new_page()
    page.goto(app.url("/accounts/login/"))
    page.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.__inlineRan = 1'; document.body.appendChild(s); }"
    )
    for _ in range(WAIT * 20):  # the report arrives asynchronously
        if watch.violations:
            break
        page.wait_for_timeout(50)
    assert page.evaluate("window.__inlineRan") is None
    assert any(v.get("directive") == "script-src-elem" for v in watch.violations), watch.violations
    assert page.evaluate("htmx.config.allowEval") is False
    assert page.evaluate("htmx.config.includeIndicatorStyles") is False
    assert "style" not in page.evaluate("htmx.config.attributesToSettle")  # see base.html
    assert page.locator("head style").count() == 0  # htmx injected no indicator styles


def test_every_page_passes_the_policy_with_htmx_and_the_live_socket(app, api, watch, shoot):
    # Sign in (the login page and its form post).
    page = login(watch.context(), app, "reviewer")

    # The inbox: the socket connects (connect-src), a card arrives live, is decided.
    open_inbox(page, app)
    run_id, request_id = halted_run(api, f"Refund order A-3001, $40 (csp {tag()})")
    card = card_of(page, request_id)
    expect(card).to_be_visible()
    watch.settle(page)

    # The request's own page, then back to the inbox to decline it there (an htmx post).
    page.goto(app.url(f"/requests/{request_id}/"))
    expect(page.locator("main")).to_contain_text("refund")
    open_inbox(page, app)
    card = card_of(page, request_id)
    reason = f"csp check {tag()}"
    card.locator("textarea[name=reason]").fill(reason)
    card.get_by_role("button", name=BUTTON["Decline"]).click()
    expect(page.locator("#toasts")).to_contain_text("declined", timeout=WAIT * 1000)
    watch.settle(page)

    # The run page: live, the model's reply arrives over the socket.
    page.goto(app.url(f"/runs/{run_id}/"))
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    expect(page.locator("section.final")).to_contain_text(reason, timeout=WAIT * 1000)
    shoot(page, "run-page")

    # Starting a run from its page (form post, redirect to the new run's live page).
    page.goto(app.url("/runs/new/"))
    page.fill("#prompt", f"Refund order A-3002, $10 (csp {tag()})")
    page.get_by_role("button", name="Start").click()
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    new_run = int(re.search(r"/runs/(\d+)/$", page.url).group(1))
    wait_run(api, new_run, "pending")
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    expect(page.locator("article.card")).to_have_count(1, timeout=WAIT * 1000)  # pushed live
    page.goto(app.url("/runs/"))
    expect(page.locator("main")).to_contain_text(f"#{new_run}")
    watch.settle(page)

    # The Django admin, as the superuser: the index and a change list with its scripts.
    admin = login(watch.context(), app, "admin")
    admin.goto(app.url("/admin/"))
    expect(admin.locator("#site-name")).to_be_visible()
    admin.goto(app.url("/admin/approvals/approvalrequest/"))
    expect(admin.locator("#changelist")).to_be_visible()
    shoot(admin, "admin")
    watch.settle(admin)
    watch.settle(page)

    watch.assert_clean()
    paths = {re.sub(r"^https?://[^/]+", "", url).split("?")[0] for url, _ in watch.documents}
    for path in (
        "/accounts/login/",
        "/",
        f"/requests/{request_id}/",
        f"/runs/{run_id}/",
        "/runs/new/",
        "/runs/",
        "/admin/",
    ):
        assert path in paths, (path, sorted(paths))


def test_opening_a_request_in_the_detail_pane_passes_the_policy(app, api, watch, shoot):
    """The detail pane (`?r=`): opened by a click (an htmx swap with its indicator), by its
    URL, by the keys, on a phone; with its claim bar, history and the run's transcript."""
    t = tag()
    _, first = halted_run(api, f"Refund order A-3101, $12 (pane {t})")
    _, second = halted_run(api, f"Ask the customer a question (pane {t})")
    page = login(watch.context(), app, "reviewer")
    open_inbox(page, app, f"q={t}")

    # a click opens it beside the list
    card = card_of(page, first)
    expect(card).to_be_visible()
    expect(page.locator("#detail .claim-bar")).to_be_visible()
    expect(page.locator("#detail section.history")).to_be_visible()
    watch.settle(page)

    # the keys: the next request, its claim bar, the argument editor, the keys' list
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    expect(card_of(page, second)).to_be_visible()
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.keyboard.press("c")
    expect(page.locator("#detail .claim-bar")).to_contain_text("Claimed by you")
    page.keyboard.press("?")
    expect(page.locator("#keys-help")).to_be_visible()
    page.keyboard.press("Escape")
    watch.settle(page)

    # its URL, loaded as a page
    page.goto(app.url(f"/?q={t}&r={first}"))
    opened = page.locator(f'#detail article.card[data-request-id="{first}"]')
    expect(opened).to_be_visible()
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    page.locator("#detail details.edit > summary").click()
    watch.settle(page)

    # the reviewer makes the reason box taller (an inline height, as dragging its corner
    # does), then the card is rendered again: live (another reviewer claims it) and by a
    # reload; htmx must not carry the height over as a style attribute
    page.locator("#detail details.edit > summary").click()  # closed: the push may replace it
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    opened.locator("textarea[name=reason]").evaluate("box => { box.style.height = '9rem'; }")
    api.post(f"/api/requests/{first}/claim", json={})
    expect(page.locator("#detail .claim-bar")).to_contain_text("Claimed by you")
    opened.locator("textarea[name=reason]").evaluate("box => { box.style.height = '9rem'; }")
    page.evaluate(RELOAD_CARD, first)
    page.wait_for_function("() => window.__reloaded === 1")
    expect(opened).to_be_visible()
    watch.settle(page)

    # on a phone: the request as a screen of its own, and back
    phone = login(watch.context(viewport={"width": 390, "height": 844}), app, "reviewer")
    phone.goto(app.url(f"/?q={t}&r={second}"))
    expect(phone.locator(f'#detail article.card[data-request-id="{second}"]')).to_be_visible()
    phone.get_by_role("link", name="Back to list").click()
    expect(phone.locator("#request-list")).to_be_visible()
    watch.settle(phone)
    shoot(page, "detail-pane")

    watch.assert_clean()
