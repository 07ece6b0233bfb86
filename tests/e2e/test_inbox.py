"""Reviewer flows in a real browser: live inbox across reviewers, races, escaping, no-JS,
roles, and a phone-sized screen. The app runs in subprocesses (see conftest.py)."""

from __future__ import annotations

import re
import secrets
import time

import httpx
import pytest
from playwright.sync_api import BrowserContext, Locator, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from .conftest import WAIT, App

pytestmark = pytest.mark.e2e

HOSTILE_IMG = "<img src=x onerror=window.__xss=1>"
# Buttons name what they act on ("Decline refund A-1001"); these match the action alone.
BUTTON = {name: re.compile(rf"^{name}(?! all)\b") for name in ("Approve", "Decline")}
HOSTILE_SCRIPT = "<script>window.__xss=1</script>"


# -- helpers -------------------------------------------------------------------------------


def login(context: BrowserContext, app: App, username: str) -> Page:
    page = context.new_page()
    page.goto(app.url("/accounts/login/"))
    page.fill("#id_username", username)
    page.fill("#id_password", app.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(app.url("/"))
    return page


def open_inbox(page: Page, app: App, query: str = "") -> None:
    page.goto(app.url("/" + (f"?{query}" if query else "")))
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)


def start_run(api: httpx.Client, prompt: str) -> int:
    response = api.post("/api/runs", json={"agent": "demo", "prompt": prompt})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def wait_run(api: httpx.Client, run_id: int, *statuses: str) -> dict:
    deadline = time.monotonic() + WAIT
    while True:
        run = api.get(f"/api/runs/{run_id}").json()
        if run["status"] in statuses:
            return run
        assert time.monotonic() < deadline, f"run {run_id} stayed {run['status']}"
        time.sleep(0.1)


def halted_run(api: httpx.Client, prompt: str) -> tuple[int, str]:
    """Start a demo run and wait until it halts; its id and the open request's id."""
    run_id = start_run(api, prompt)
    run = wait_run(api, run_id, "pending")
    return run_id, run["pending"]["request"]["id"]


def row_of(page: Page, request_id: str) -> Locator:
    """The request's row in the inbox list."""
    return page.locator(f'#request-rows li.row[data-request-id="{request_id}"]')


def card_of(page: Page, request_id: str) -> Locator:
    """The request's card. In the inbox (a list and a detail pane) the card shows once its
    row is selected: unless the pane shows it already, wait for the row (it may arrive live)
    and click it, as a reviewer does. Elsewhere (a run's page, a request's page) the card."""
    card = page.locator(f'article.card[data-request-id="{request_id}"]')
    if page.locator("#request-rows").count() and not card.count():
        row_of(page, request_id).locator("a.row-link").click(timeout=WAIT * 1000)
        expect(card).to_have_count(1)
        expect(page).to_have_url(re.compile(rf"[?&]r={re.escape(request_id)}(&|$)"))
    return card


def tag() -> str:
    return secrets.token_hex(3)


def no_xss(page: Page) -> None:
    assert page.evaluate("window.__xss") is None


def reload_until(page: Page, locator: Locator, text: str | re.Pattern[str]) -> None:
    """Without JavaScript nothing is live: reload until `locator` shows `text`."""
    deadline = time.monotonic() + WAIT
    while True:
        if locator.count() and (
            text.search(locator.first.inner_text())
            if isinstance(text, re.Pattern)
            else text in locator.first.inner_text()
        ):
            return
        assert time.monotonic() < deadline, f"{locator} never showed {text!r}"
        time.sleep(0.3)
        page.reload()


# -- tests ---------------------------------------------------------------------------------


def test_two_reviewers_see_a_request_live_and_a_decline_reaches_the_model(
    app, api, contexts, shoot
):
    page_a = login(contexts(), app, "reviewer")
    page_b = login(contexts(), app, "reviewer2")
    open_inbox(page_a, app)
    open_inbox(page_b, app)

    run_id, request_id = halted_run(api, f"Refund order A-1001, $250 (live {tag()})")
    card_a, card_b = card_of(page_a, request_id), card_of(page_b, request_id)
    expect(card_a).to_be_visible()  # arrived over the websocket: no reload
    expect(card_b).to_be_visible()
    expect(card_a).to_contain_text("refund")
    expect(card_b.get_by_role("button", name=BUTTON["Decline"])).to_be_visible()
    shoot(page_a, "1-card-arrived-a")
    shoot(page_b, "1-card-arrived-b")

    reason = f"over the refund limit {tag()}"
    card_a.locator("textarea[name=reason]").fill(reason)
    card_a.get_by_role("button", name=BUTTON["Decline"]).click()

    # dropped live from B's pending list; B's open card says who decided
    expect(row_of(page_b, request_id)).to_have_count(0, timeout=5_000)
    expect(page_b.locator("#toasts")).to_contain_text("declined by reviewer")
    expect(card_b.locator(".decided")).to_contain_text("Declined by reviewer")
    shoot(page_b, "2-card-gone-b")

    page_a.goto(app.url(f"/runs/{run_id}/"))
    expect(page_a.locator("#live[data-ws-open]")).to_have_count(1)
    final = page_a.locator("section.final")
    expect(final).to_contain_text(reason, timeout=WAIT * 1000)
    expect(page_a.locator(".decision-note")).to_contain_text("Declined by reviewer")
    shoot(page_a, "3-run-reply")
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "done"
    assert reason in run["text"]


def test_a_new_requests_toast_leaves_its_buttons_clickable(app, api, contexts, shoot):
    """On a common laptop screen the card that just arrived must be decidable at once."""
    page = login(contexts(viewport={"width": 1280, "height": 720}), app, "reviewer")
    open_inbox(page, app)
    _, request_id = halted_run(api, f"Refund order A-1007, $60 (toast {tag()})")
    card = card_of(page, request_id)
    expect(card).to_be_visible()
    expect(page.locator("#toasts .toast").first).to_be_visible()
    shoot(page, "toast")
    for name in ("Approve", "Decline"):
        button = card.get_by_role("button", name=BUTTON[name])
        try:
            # a trial click runs every actionability check (visible, enabled, not covered)
            button.click(trial=True, timeout=2_000)
        except PlaywrightTimeoutError:
            covering = button.evaluate(
                """b => { const r = b.getBoundingClientRect();
                   const el = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
                   return el ? el.outerHTML.slice(0, 120) : null; }"""
            )
            pytest.fail(f"the {name} button of the new card is covered by {covering}")


def test_double_click_and_a_simultaneous_decision_make_exactly_one_decision(
    app, api, contexts, shoot
):
    page_a = login(contexts(), app, "reviewer")
    page_b = login(contexts(), app, "reviewer2")
    open_inbox(page_a, app)
    open_inbox(page_b, app)
    _, request_id = halted_run(api, f"Refund order A-1002, $75 (race {tag()})")
    card_a, card_b = card_of(page_a, request_id), card_of(page_b, request_id)
    expect(card_a).to_be_visible()
    expect(card_b).to_be_visible()

    reasons = {"reviewer": f"A says no {tag()}", "reviewer2": f"B says no {tag()}"}
    card_a.locator("textarea[name=reason]").fill(reasons["reviewer"])
    card_b.locator("textarea[name=reason]").fill(reasons["reviewer2"])
    decline_a = card_a.get_by_role("button", name=BUTTON["Decline"])
    decline_b = card_b.get_by_role("button", name=BUTTON["Decline"])
    # B's click is armed in B's page first (a Playwright click would wait for a card the
    # live push may already have removed), then A double-clicks: both land together.
    decline_b.evaluate("button => setTimeout(() => button.click(), 40)")
    decline_a.dblclick()

    deadline = time.monotonic() + WAIT
    while (request := api.get(f"/api/requests/{request_id}").json())["state"] == "pending":
        assert time.monotonic() < deadline, "nobody's decline landed"
        time.sleep(0.1)
    decision = request["decision"]
    assert request["state"] == "declined"
    winner = decision["decided_by"]
    assert winner in reasons
    assert decision["reason"] == reasons[winner]
    # the loser is told who won, whichever way the news reached it first (its own 409 answer
    # or the live push that removed the card)
    winner_page, loser_page = (page_a, page_b) if winner == "reviewer" else (page_b, page_a)
    expect(loser_page.get_by_text(f"Already declined by {winner}").first).to_be_visible(
        timeout=5_000
    )
    # ... and the reason the loser typed is not lost: its late answer's card keeps it to
    # copy, or (when the live push came first and its armed click found the button gone)
    # the card it typed in is still there with the reason in it
    loser = "reviewer2" if winner == "reviewer" else "reviewer"
    loser_page.wait_for_function(
        "reason => [...document.querySelectorAll('textarea')].some(t => t.value === reason)",
        arg=reasons[loser],
        timeout=5_000,
    )

    # the audit trail holds exactly one decision for this request, and it stays that way
    time.sleep(0.5)
    again = api.get(f"/api/requests/{request_id}").json()
    assert again["decision"]["decided_by"] == winner
    assert again["decision"]["decided_at"] == decision["decided_at"]
    count = app.manage(
        "shell",
        "-c",
        "from approvals.models import Event; print(Event.objects.filter("
        f"request__request_id={request_id!r}, action__in=['request_declined', "
        "'request_approved', 'request_answered']).count())",
    )
    assert count.strip().splitlines()[-1] == "1"

    shoot(winner_page, "winner")
    shoot(loser_page, "loser")


def test_hostile_html_is_shown_as_text_and_never_runs(app, api, contexts, shoot):
    page_a = login(contexts(), app, "reviewer")
    page_b = login(contexts(), app, "reviewer2")
    open_inbox(page_b, app)

    prompt = f"Refund {HOSTILE_IMG} {HOSTILE_SCRIPT} ({tag()})"
    page_a.goto(app.url("/runs/new/"))
    page_a.fill("#prompt", prompt)
    page_a.get_by_role("button", name="Start").click()
    page_a.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run_id = int(re.search(r"/runs/(\d+)/$", page_a.url).group(1))
    request_id = wait_run(api, run_id, "pending")["pending"]["request"]["id"]

    card_b = card_of(page_b, request_id)
    expect(card_b).to_contain_text(HOSTILE_IMG)  # live-pushed, shown as text
    expect(card_b).to_contain_text(HOSTILE_SCRIPT)
    assert card_b.locator("img, script").count() == 0
    no_xss(page_b)

    # B watches the run page while A declines with a hostile reason in the inbox
    page_b.goto(app.url(f"/runs/{run_id}/"))
    expect(page_b.locator("#live[data-ws-open]")).to_have_count(1)
    open_inbox(page_a, app)
    card_a = card_of(page_a, request_id)
    expect(card_a).to_contain_text(HOSTILE_SCRIPT)
    no_xss(page_a)
    reason = f"no {HOSTILE_IMG} {HOSTILE_SCRIPT}"
    card_a.locator("textarea[name=reason]").fill(reason)
    card_a.get_by_role("button", name=BUTTON["Decline"]).click()

    final = page_b.locator("section.final")
    expect(final).to_contain_text(HOSTILE_IMG, timeout=WAIT * 1000)  # live on B's run page
    expect(page_b.locator(".decision-note")).to_contain_text(HOSTILE_SCRIPT)
    assert page_b.locator("#run-body img, #run-body script").count() == 0
    shoot(page_b, "run-page")
    no_xss(page_b)
    no_xss(page_a)

    page_a.goto(app.url(f"/runs/{run_id}/"))
    expect(page_a.locator("section.final")).to_contain_text(HOSTILE_SCRIPT)
    page_a.goto(app.url("/?state=all"))
    expect(card_of(page_a, request_id)).to_contain_text(HOSTILE_IMG)
    shoot(page_a, "inbox-all")
    no_xss(page_a)


def test_cancel_from_the_live_run_page(app, api, contexts, shoot):
    """The run page's body is re-rendered over the websocket on connect: its plain forms
    (Cancel, Retry) must still post with a CSRF token."""
    run_id, request_id = halted_run(api, f"Refund order A-1008, $20 (cancel {tag()})")
    page = login(contexts(), app, "reviewer")
    page.goto(app.url(f"/runs/{run_id}/"))
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    expect(page.locator("#run-body")).to_contain_text("Waiting for a decision")
    page.get_by_role("button", name="Cancel this run").click()
    page.wait_for_load_state()
    # Irreversible: a confirmation step first, which changes nothing until confirmed.
    expect(page.get_by_role("heading", name=f"Cancel run #{run_id}?")).to_be_visible()
    assert api.get(f"/api/runs/{run_id}").json()["status"] == "pending"
    shoot(page, "confirm-cancel")
    page.get_by_role("button", name="Yes, cancel the run").click()
    page.wait_for_load_state()
    shoot(page, "after-cancel")
    expect(page.locator("#toasts")).to_contain_text("Run cancelled.")
    assert api.get(f"/api/runs/{run_id}").json()["status"] == "cancelled"
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "cancelled"


def test_the_whole_flow_works_without_javascript(app, contexts, shoot):
    context = contexts(java_script_enabled=False)
    page = login(context, app, "reviewer")

    prompt = f"Refund order A-1003, $40 (no js {tag()})"
    page.goto(app.url("/runs/new/"))
    page.fill("#prompt", prompt)
    page.get_by_role("button", name="Start").click()
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))

    page.goto(app.url("/"))
    link = page.locator(f'#request-rows a.row-link[title="{prompt}"]')
    reload_until(page, link, "ago")  # its row: agent, tool, arguments, age
    link.first.click()  # a plain link: the page with the request selected
    page.wait_for_load_state()
    card = page.locator("#detail article.card")
    expect(card).to_contain_text(prompt)
    shoot(page, "1-card")

    reason = f"customer already got store credit {tag()}"
    card.locator("textarea[name=reason]").fill(reason)
    card.get_by_role("button", name=BUTTON["Decline"]).click()
    page.wait_for_load_state()
    assert urlpath(page.url) == "/"
    expect(link).to_have_count(0)  # no longer in the pending list
    expect(page.locator("#detail .decided")).to_contain_text("Declined by reviewer")
    expect(page.locator("#toasts")).not_to_contain_text("Declined.")  # said once: the footer
    shoot(page, "2-flash")

    page.goto(app.url(f"/runs/{run_id}/"))
    reload_until(page, page.locator("section.final"), reason)
    expect(page.locator(".decision-note")).to_contain_text("Declined by reviewer")
    shoot(page, "3-run-reply")


def urlpath(url: str) -> str:
    return re.sub(r"^https?://[^/]+", "", url).split("?")[0]


def test_watcher_sees_cards_without_decision_buttons(app, api, contexts, shoot):
    page = login(contexts(), app, "watcher")
    open_inbox(page, app)
    run_id, request_id = halted_run(api, f"Refund order A-1004, $15 (watch {tag()})")
    card = card_of(page, request_id)
    expect(card).to_be_visible()
    expect(card).to_contain_text("You can watch but not decide.")
    assert card.locator("button, form, textarea").count() == 0
    expect(page.get_by_role("link", name="Start a run")).to_have_count(0)
    shoot(page, "inbox")

    page.goto(app.url(f"/runs/{run_id}/"))
    expect(page.locator("#run-body")).to_contain_text("Waiting for a decision")
    assert page.locator("#run-body button").count() == 0

    response = page.request.post(
        app.url(f"/requests/{request_id}/decline/"), form={"reason": "watcher"}
    )
    assert response.status == 403  # no CSRF token either, but never a decision
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "pending"


def test_anonymous_users_are_sent_to_the_login_page(app, contexts):
    page = contexts().new_page()
    page.goto(app.url("/"))
    assert urlpath(page.url) == "/accounts/login/"
    assert "next=/" in page.url
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    page.goto(app.url("/runs/1/"))
    assert urlpath(page.url) == "/accounts/login/"


def test_phone_sized_inbox_has_no_horizontal_scrolling(app, api, contexts, shoot):
    context = contexts(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = login(context, app, "reviewer")
    run_id, request_id = halted_run(
        api, f"Refund order A-1005, $999 for the customer who wrote a very long complaint {tag()}"
    )
    two_calls, _ = halted_run(api, f"Refund order A-1006 $30 and email the customer ({tag()})")
    open_inbox(page, app)
    # two screens: the list first (no detail pane) ...
    expect(row_of(page, request_id)).to_be_visible()
    expect(page.locator("#detail")).to_be_hidden()
    shoot(page, "inbox")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the inbox is {width}px wide on a 390px screen"
    # ... then the request, without the list, and back
    for step, request in (("detail-one-call", request_id), ("detail-two-calls", None)):
        if request is None:
            request = api.get(f"/api/runs/{two_calls}").json()["pending"]["request"]["id"]
        card = card_of(page, request)
        expect(card).to_be_visible()
        expect(page.locator("#request-list")).to_be_hidden()
        shoot(page, step)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the request is {width}px wide on a 390px screen"
        page.get_by_role("link", name="Back to list").click()
        expect(row_of(page, request)).to_be_visible()
        expect(page.locator("#detail")).to_be_hidden()

    for step, run in (("run-one-call", run_id), ("run-two-calls", two_calls)):
        page.goto(app.url(f"/runs/{run}/"))
        expect(page.locator("#run-body")).to_contain_text("Waiting for a decision")
        shoot(page, step)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"run {run}'s page is {width}px wide on a 390px screen"
