"""A record reviewers can trust, in a real browser: your own decision is confirmed as yours,
live updates never eat what a reviewer typed, a signed-out tab stops being live and says so,
failed requests say so and keep the typed text, a forbidden action names the permission,
toasts never cover a card's controls, and relative times keep up.

Live messages are held and released deterministically by an init script that wraps the
page's WebSocket (`window.__ws`: `hold()`, `release()`, `queue`, `log`)."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from playwright.sync_api import BrowserContext, Locator, Page, expect

from .conftest import WAIT, App
from .test_inbox import card_of, halted_run, open_inbox, row_of, tag

pytestmark = pytest.mark.e2e

# Wraps WebSocket so a test can hold incoming messages (the snapshot on connect included)
# and release them when it chooses. `HOLD` is replaced by "true" or "false".
HOLD_WS = """
(() => {
  const Native = window.WebSocket;
  const ws = { on: HOLD, queue: [], log: [], sockets: [] };
  ws.hold = () => { ws.on = true; };
  ws.release = () => { ws.on = false; ws.queue.splice(0).forEach((deliver) => deliver()); };
  function Held(url, protocols) {
    const sock = new Native(url, protocols);
    ws.sockets.push(sock);
    const add = sock.addEventListener.bind(sock);
    sock.addEventListener = (type, fn, opts) => {
      if (type !== "message") return add(type, fn, opts);
      return add(type, (event) => {
        const deliver = () => { ws.log.push(event.data); fn.call(sock, event); };
        if (ws.on) ws.queue.push(Object.assign(deliver, { data: event.data }));
        else deliver();
      }, opts);
    };
    return sock;
  }
  Held.prototype = Native.prototype;
  Object.assign(Held, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
  window.WebSocket = Held;
  window.__ws = ws;
})();
"""


# -- helpers -------------------------------------------------------------------------------


def login(context: BrowserContext, app: App, username: str, *, hold: bool | None = None) -> Page:
    page = context.new_page()
    if hold is not None:
        page.add_init_script(HOLD_WS.replace("HOLD", "true" if hold else "false"))
    sign_in(page, app, username)
    return page


def sign_in(page: Page, app: App, username: str) -> None:
    page.goto(app.url("/accounts/login/"))
    page.fill("#id_username", username)
    page.fill("#id_password", app.password)
    page.locator("form[action='/accounts/login/'] button[type=submit]").click()
    page.wait_for_url(app.url("/"))


def wait_decided(api: httpx.Client, request_id: str) -> dict:
    deadline = time.monotonic() + WAIT
    while (row := api.get(f"/api/requests/{request_id}").json())["state"] == "pending":
        assert time.monotonic() < deadline, f"request {request_id} stayed pending"
        time.sleep(0.1)
    return row


def decline_button(card: Locator) -> Locator:
    return card.locator("form.decline button[type=submit]")


def reason_box(card: Locator) -> Locator:
    return card.locator("form.decline textarea[name=reason]")


def api_as(app: App, username: str) -> httpx.Client:
    token = app.manage("api_token", username, "--name", f"e2e-{tag()}").strip().splitlines()[-1]
    return httpx.Client(
        base_url=app.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


def focused_request_id(page: Page) -> str | None:
    return page.evaluate(
        "() => { const c = document.activeElement && document.activeElement.closest('article.card');"
        " return c ? c.dataset.requestId : null; }"
    )


def wait_js(page: Page, predicate: str, arg=None) -> None:
    """Poll a JavaScript predicate (a function) until it holds. Not `wait_for_function`:
    Playwright evaluates its predicate with eval, which the pages' CSP (no unsafe-eval)
    blocks; `evaluate` runs the function through the debugger protocol instead."""
    deadline = time.monotonic() + WAIT
    while not page.evaluate(predicate, arg):
        assert time.monotonic() < deadline, f"never held: {predicate}"
        page.wait_for_timeout(50)


def wait_logged(page: Page, fragment: str) -> None:
    """Wait until the page's socket delivered (or queued) a message containing `fragment`."""
    wait_js(
        page,
        "f => window.__ws.log.concat(window.__ws.queue.map(d => d.data)).some(m => m.includes(f))",
        fragment,
    )


# -- 6. your own decision is confirmed as yours ----------------------------------------------


@pytest.mark.parametrize("first", ["live_push", "response"])
def test_your_own_decline_is_confirmed_as_yours_and_focus_moves_on(
    app, api, contexts, shoot, first
):
    """The deciding tab says "You declined: <reason>" once, never "Already declined by <you>",
    whichever of its own response and the live push arrives first; focus moves to the next
    card. The same reviewer's other tab says "You declined" too; another reviewer's inbox
    says who decided."""
    _, older = halted_run(api, f"Refund order A-3001, $10 (older {tag()})")
    _, newer = halted_run(api, f"Refund order A-3002, $20 (newer {tag()})")
    context = contexts()
    page = login(context, app, "reviewer", hold=False)
    other_tab = context.new_page()
    colleague = login(contexts(), app, "reviewer2")
    for p in (page, other_tab, colleague):
        open_inbox(p, app)
    expect(row_of(page, older)).to_be_visible()
    card = card_of(page, newer)
    expect(card).to_be_visible()
    dom_id = card.get_attribute("id")
    row_id = dom_id.replace("request-", "row-")

    reason = f"the customer's duplicate of an <b>earlier</b> refund {tag()}"  # shown as text
    reason_box(card).fill(reason)
    held = []
    if first == "live_push":
        # the server decides at once, but its answer reaches the page only after the push
        page.route("**/requests/*/decline/", lambda route: held.append(route))
    else:
        page.evaluate("window.__ws.hold()")
    decline_button(card).click()

    if first == "live_push":
        while not held:
            page.wait_for_timeout(20)
        response = held[0].fetch()
        wait_logged(page, f'<div id="{row_id}" hx-swap-oob="delete">')
        expect(card).to_be_visible()  # the deciding tab waits for its own answer
        held[0].fulfill(response=response)
    else:
        expect(card).to_have_count(0)
        wait_logged(page, f'<div id="{row_id}" hx-swap-oob="delete">')  # queued, not delivered
        page.evaluate("window.__ws.release()")

    toasts = page.locator("#toasts")
    expect(toasts).to_contain_text(f"You declined: {reason}")
    expect(card).to_have_count(0)
    page.wait_for_timeout(500)  # anything late would have arrived by now
    assert "Already" not in toasts.inner_text()
    expect(toasts.get_by_text(f"You declined: {reason}")).to_have_count(1)
    # the next row opens by itself, and has the focus
    expect(card_of(page, older)).to_be_visible()
    expect(row_of(page, newer)).to_have_count(0)
    expect(page).to_have_url(re.compile(rf"[?&]r={older}"))
    assert focused_request_id(page) == older
    shoot(page, "deciding-tab")

    expect(row_of(other_tab, newer)).to_have_count(0)
    expect(other_tab.locator("#toasts")).to_contain_text(f"You declined: {reason}")
    assert "Already" not in other_tab.locator("#toasts").inner_text()
    expect(row_of(colleague, newer)).to_have_count(0)
    expect(colleague.locator("#toasts")).to_contain_text("Already declined by reviewer")

    row = wait_decided(api, newer)
    assert (row["state"], row["decision"]["reason"]) == ("declined", reason)


def test_deciding_the_last_request_keeps_its_card_with_the_outcome(app, api, contexts):
    """With no other row left to open, the decided card stays, saying what happened, and
    keeps the focus; its row leaves the pending list."""
    context = contexts()
    page = login(context, app, "reviewer", hold=True)
    open_inbox(page, app)
    wait_js(page, "() => window.__ws.queue.length >= 1")  # the snapshot
    page.evaluate("window.__ws.release()")
    # only the new request's row will be on this page
    page.evaluate("document.querySelectorAll('#request-rows li.row').forEach(r => r.remove())")
    _, request_id = halted_run(api, f"Refund order A-3003, $30 (last {tag()})")
    card = card_of(page, request_id)
    expect(card).to_be_visible()
    decline_button(card).click()
    expect(page.locator("#toasts")).to_contain_text("You declined")
    expect(card.locator(".decided")).to_contain_text("Declined by reviewer")
    expect(row_of(page, request_id)).to_have_count(0)
    assert focused_request_id(page) == request_id


# -- 7. live updates never replace what a reviewer typed ----------------------------------


@pytest.mark.parametrize("focus", ["focused", "typed_then_blurred"])
def test_the_snapshot_on_connect_keeps_what_the_reviewer_typed(app, api, contexts, shoot, focus):
    """The socket's snapshot arrives after the reviewer typed a reason: the reason stays, the
    decline goes out with it and a valid CSRF token."""
    _, request_id = halted_run(api, f"Refund order A-3101, $15 (snapshot {tag()})")
    page = login(contexts(), app, "reviewer", hold=True)
    open_inbox(page, app)
    wait_js(page, "() => window.__ws.queue.length >= 1")  # the snapshot, held
    card = card_of(page, request_id)
    reason = f"typed before the snapshot {tag()}"
    reason_box(card).fill(reason)
    if focus == "typed_then_blurred":
        page.locator("h1").click()
        assert focused_request_id(page) is None
    page.evaluate("document.getElementById('request-list').dataset.stale = '1'")
    page.evaluate("window.__ws.release()")
    expect(page.locator("#request-list[data-stale]")).to_have_count(0)  # the list was swapped
    expect(reason_box(card)).to_have_value(reason)
    if focus == "focused":
        assert page.evaluate("document.activeElement.name") == "reason"
    shoot(page, "after-snapshot")

    decline_button(card).click()
    row = wait_decided(api, request_id)
    assert (row["state"], row["decision"]["reason"]) == ("declined", reason)
    expect(page.locator("#toasts")).to_contain_text(f"You declined: {reason}")


def test_the_run_pages_snapshot_keeps_what_the_reviewer_typed(app, api, contexts):
    run_id, request_id = halted_run(api, f"Refund order A-3104, $27 (run page {tag()})")
    page = login(contexts(), app, "reviewer", hold=True)
    page.goto(app.url(f"/runs/{run_id}/"))
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    wait_js(page, "() => window.__ws.queue.length >= 1")  # the run body, held
    card = card_of(page, request_id)
    reason = f"typed on the run page {tag()}"
    reason_box(card).fill(reason)
    page.evaluate("document.getElementById('run-body').dataset.stale = '1'")
    page.evaluate("window.__ws.release()")
    expect(page.locator("#run-body[data-stale]")).to_have_count(0)
    expect(reason_box(card)).to_have_value(reason)
    decline_button(card).click()
    row = wait_decided(api, request_id)
    assert (row["state"], row["decision"]["reason"]) == ("declined", reason)


def test_a_snapshot_without_the_typed_card_keeps_it_and_says_who_decided(app, api, contexts):
    """The socket connects late (held by the test): meanwhile a colleague declined the request
    the reviewer is typing into, so the snapshot no longer lists it. The card stays, with
    what was typed, and says who decided."""
    _, request_id = halted_run(api, f"Refund order A-3103, $26 (late socket {tag()})")
    page = login(contexts(), app, "reviewer")
    sockets = []
    page.route_web_socket(re.compile(r".*/ws/inbox/.*"), lambda ws: sockets.append(ws))
    open_inbox(page, app)  # the page's socket is open, the server's not connected yet
    card = card_of(page, request_id)
    reason = f"typed while the socket was late {tag()}"
    reason_box(card).fill(reason)
    with api_as(app, "reviewer2") as colleague:
        response = colleague.post(
            f"/api/requests/{request_id}/decline", json={"reason": "colleague was faster"}
        )
        assert response.status_code == 200, response.text
    page.evaluate("document.getElementById('request-list').dataset.stale = '1'")
    sockets[0].connect_to_server()  # now the snapshot: without this request
    expect(page.locator("#request-list[data-stale]")).to_have_count(0)
    notice = card.locator(".live-notice")
    expect(notice).to_contain_text("reviewer2", timeout=WAIT * 1000)
    expect(reason_box(card)).to_have_value(reason)
    assert page.evaluate("document.activeElement.name") == "reason"


@pytest.mark.parametrize("query", ["", "state=all"])
def test_a_decision_elsewhere_keeps_the_typed_form_and_says_who_decided(
    app, api, contexts, shoot, query
):
    _, request_id = halted_run(api, f"Refund order A-3102, $25 (elsewhere {tag()})")
    page = login(contexts(), app, "reviewer", hold=False)
    open_inbox(page, app, query)
    card = card_of(page, request_id)
    reason = f"I was still typing {tag()}"
    reason_box(card).fill(reason)
    with api_as(app, "reviewer2") as colleague:
        response = colleague.post(
            f"/api/requests/{request_id}/decline", json={"reason": "colleague was faster"}
        )
        assert response.status_code == 200, response.text
    notice = card.locator(".live-notice")
    expect(notice).to_contain_text("reviewer2", timeout=WAIT * 1000)
    expect(notice).to_contain_text("declined")
    expect(notice.get_by_role("button", name="Reload it")).to_be_visible()
    expect(reason_box(card)).to_have_value(reason)
    shoot(page, "kept-with-notice")

    notice.get_by_role("button", name="Reload it").click()
    expect(card.locator("form.decline")).to_have_count(0)
    expect(card).to_contain_text("colleague was faster")


# -- 8. signed out: no longer live, and says so ----------------------------------------------


def test_signing_out_ends_the_live_inbox_and_a_click_says_signed_out(app, api, contexts, shoot):
    _, request_id = halted_run(api, f"Refund order A-3201, $35 (signed out {tag()})")
    context = contexts()
    page = login(context, app, "reviewer", hold=False)
    open_inbox(page, app)
    card = card_of(page, request_id)
    reason = f"typed before signing out {tag()}"
    reason_box(card).fill(reason)

    other = context.new_page()
    other.goto(app.url("/runs/"))
    other.locator("form.who button[type=submit]").click()
    other.wait_for_url(re.compile(r".*/accounts/login/.*"))

    banner = page.locator("#page-alerts")
    expect(banner).to_contain_text("You are signed out")
    expect(page.locator("#live")).not_to_have_attribute("data-ws-open", "1")
    # nothing live reaches a signed-out tab any more
    _, later = halted_run(api, f"Refund order A-3202, $36 (after sign-out {tag()})")
    page.wait_for_timeout(1000)
    expect(row_of(page, later)).to_have_count(0)

    decline_button(card).click()
    expect(banner.get_by_role("link", name="sign in again")).to_be_visible()
    expect(page.locator("#main #id_username")).to_have_count(0)  # no login page in the inbox
    expect(reason_box(card)).to_have_value(reason)
    shoot(page, "signed-out")
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "pending"

    # sign in again in the other tab; the first tab's typed decline now goes through
    sign_in(other, app, "reviewer")
    decline_button(card).click()
    row = wait_decided(api, request_id)
    assert (row["state"], row["decision"]["reason"]) == ("declined", reason)


# -- 9. decisions never fail silently ----------------------------------------------------------


@pytest.mark.parametrize("failure", ["unreachable", "server_error"])
def test_a_failed_decision_says_so_and_keeps_the_reason(app, api, contexts, shoot, failure):
    _, request_id = halted_run(api, f"Refund order A-3301, $45 ({failure} {tag()})")
    page = login(contexts(), app, "reviewer", hold=False)
    open_inbox(page, app)
    card = card_of(page, request_id)
    reason = f"kept through the outage {tag()}"
    reason_box(card).fill(reason)

    def fail(route):
        if failure == "unreachable":
            route.abort("connectionrefused")
        else:
            route.fulfill(status=500, body="<h1>Server Error (500)</h1>", content_type="text/html")

    page.route("**/requests/*/decline/", fail)
    decline_button(card).click()
    notice = card.locator(".client-notice")
    expected = "Could not reach the server" if failure == "unreachable" else "server failed"
    expect(notice).to_contain_text(expected)
    expect(notice).to_contain_text("what you typed is kept")
    expect(reason_box(card)).to_have_value(reason)
    expect(decline_button(card)).to_be_enabled()
    expect(page.locator("#live")).to_have_count(1)  # the page itself was not replaced
    shoot(page, "failed")
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "pending"

    page.unroute("**/requests/*/decline/")
    decline_button(card).click()
    row = wait_decided(api, request_id)
    assert row["decision"]["reason"] == reason


# -- 12. a forbidden action names the missing permission -------------------------------------


def test_a_watchers_forbidden_action_names_the_missing_permission(app, api, contexts, shoot):
    _, request_id = halted_run(api, f"Refund order A-3401, $55 (watcher {tag()})")
    page = login(contexts(), app, "watcher")
    page.goto(app.url("/runs/new/"))
    expect(page.locator("main")).to_contain_text("approvals.add_run")
    expect(page.locator("main")).to_contain_text("Ask an administrator")
    expect(page.locator("header.top nav")).to_be_visible()  # a page of the app, not a bare 403
    shoot(page, "403-page")

    open_inbox(page, app)
    card = card_of(page, request_id)
    expect(card).to_be_visible()
    page.evaluate(
        """([id, dom]) => htmx.ajax('POST', '/requests/' + id + '/decline/',
             {target: '#' + dom, swap: 'outerHTML', values: {reason: 'watcher'}})""",
        [request_id, card.get_attribute("id")],
    )
    alert = card.locator(".client-notice")
    expect(alert).to_contain_text("approvals.decide_request")
    expect(alert).to_contain_text("Can approve, answer or decline requests")
    expect(page.locator("#live")).to_have_count(1)
    expect(card).to_contain_text("You can watch but not decide.")
    shoot(page, "403-banner")
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "pending"


# -- 14. toasts never cover a card's controls ------------------------------------------------


OVERLAPS = """
() => {
  const first = document.querySelector('#detail article.card');
  const boxes = (els) => Array.from(els).map((el) => el.getBoundingClientRect())
    .filter((r) => r.width > 0 && r.height > 0)
    .map((r) => ({ left: r.left, top: r.top, right: r.right, bottom: r.bottom }));
  const controls = boxes(first.querySelectorAll('input, textarea, button, select, summary'));
  const toasts = boxes(document.querySelectorAll('#toasts .toast'));
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  return { toasts: toasts.length, controls: controls.length,
           overlaps: toasts.flatMap((t) => controls.filter((c) => hit(t, c)).map((c) => [t, c])) };
}
"""


@pytest.mark.parametrize(
    "viewport",
    [{"width": 1280, "height": 720}, {"width": 390, "height": 844}],
    ids=["desktop", "phone"],
)
def test_a_toast_never_covers_the_first_cards_controls(app, api, contexts, shoot, viewport):
    phone = viewport["width"] < 500
    context = contexts(viewport=viewport, is_mobile=phone, has_touch=phone)
    page = login(context, app, "reviewer")
    open_inbox(page, app)
    _, request_id = halted_run(api, f"Refund order A-3501, $65 for a long toast title {tag()}")
    card = card_of(page, request_id)
    expect(card).to_be_visible()
    expect(page.locator("#toasts .toast").first).to_be_visible()
    assert page.evaluate("window.scrollY") == 0
    assert (
        page.evaluate("document.querySelector('#detail article.card').dataset.requestId")
        == request_id
    )
    shoot(page, "toast")
    found = page.evaluate(OVERLAPS)
    assert found["toasts"] >= 1 and found["controls"] >= 3, found
    assert not found["overlaps"], f"toasts cover the first card's controls: {found['overlaps']}"
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= viewport["width"], f"the inbox is {width}px wide"


# -- 15. relative times keep up ----------------------------------------------------------------


def test_relative_times_update_while_the_page_is_open(app, api, contexts):
    _, request_id = halted_run(api, f"Refund order A-3601, $75 (clock {tag()})")
    context = contexts()
    page = context.new_page()
    page.clock.install()
    sign_in(page, app, "reviewer")
    open_inbox(page, app)
    when = card_of(page, request_id).locator("p.meta time[datetime]").first
    expect(when).to_have_text(re.compile(r"^(just now|0\s+minutes ago)$"))
    page.clock.fast_forward("03:05")
    expect(when).to_have_text("3 minutes ago")
    page.clock.fast_forward(62 * 60 * 1000)
    expect(when).to_have_text("1 hour, 5 minutes ago")


# -- pushed HTML carries no token: its forms post through htmx --------------------------------


def test_the_run_pages_pushed_cancel_form_posts_with_the_pages_token(app, api, contexts):
    """The run body comes from the socket (rendered once for every viewer, without a CSRF
    token); its plain Cancel form is boosted, so htmx posts it with the token of <body
    hx-headers>, and the confirmation page's own form finishes the job."""
    run_id, _ = halted_run(api, f"Refund order A-3105, $31 (cancel {tag()})")
    # held: the snapshot must come after the marker (it could beat page.evaluate)
    page = login(contexts(), app, "reviewer", hold=True)
    page.goto(app.url(f"/runs/{run_id}/"))
    page.evaluate("document.getElementById('run-body').dataset.stale = '1'")
    wait_logged(page, 'id="run-body"')  # the socket's snapshot of the body...
    page.evaluate("window.__ws.release()")
    expect(page.locator("#run-body[data-stale]")).to_have_count(0)  # ...now on the page
    form = page.locator(f"form[action='/runs/{run_id}/cancel/']")
    assert form.locator("input[name=csrfmiddlewaretoken]").count() == 0
    form.locator("button[type=submit]").click()
    page.get_by_role("button", name="Yes, cancel the run").click()
    expect(page.locator(".status-cancelled").first).to_be_visible()
    assert api.get(f"/api/runs/{run_id}").json()["status"] == "cancelled"
