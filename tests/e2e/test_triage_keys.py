"""The triage inbox in a real browser: keys, bulk decisions, claims across two reviewers,
snooze, the title count, notifications, and a queue of 20 cleared with the keyboard alone.
The app runs in subprocesses (see conftest.py); each test lists only its own requests
through the search box (`q=<tag>`), whatever else the session left pending."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect

from .conftest import WAIT, App, _free_port
from .test_inbox import halted_run, login, start_run, tag, wait_run

pytestmark = pytest.mark.e2e


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api2(app: App):
    """The JSON API as `reviewer2`."""
    token = app.manage("api_token", "reviewer2", "--name", "e2e-k").strip().splitlines()[-1]
    with httpx.Client(
        base_url=app.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:
        yield client


# An agents module for `typed_app` (TOOLNEXUS_AGENT_MODULES): the demo as `demo-typed`, whose
# reviewers may type refund's result instead of running its executor (allow_typed_output), and
# as `demo-exec`, which runs both tools of the two-call turn on the host and takes no typed
# result (its card decides each call in one form, with no approve form).
TYPED_AGENTS = """
from approvals import agents
from approvals.agents.demo import demo_generate, demo_tools, issue_refund
from toolnexus import create_in_process_client

agents.register(
    "demo-typed",
    model=lambda: create_in_process_client(generate=demo_generate, model="demo-typed"),
    tools=demo_tools,
    executors={"refund": issue_refund},
    allow_typed_output=True,
    replace=True,
)
agents.register(
    "demo-exec",
    model=lambda: create_in_process_client(generate=demo_generate, model="demo-exec"),
    tools=demo_tools,
    executors={"refund": issue_refund, "send_email": lambda args: f"sent to {args['to']}"},
    replace=True,
)
"""


@pytest.fixture(scope="module")
def typed_app(app: App, tmp_path_factory, artifacts) -> Iterator[App]:
    """A second app (`manage.py serve`, embedded, its own SQLite file) with the agent
    `demo-typed` besides the demo: an agent is code the server imports at start-up."""
    workdir = tmp_path_factory.mktemp("e2e-typed-app")
    (workdir / "e2e_typed_agents.py").write_text(TYPED_AGENTS)
    env = {k: v for k, v in app.env.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        TOOLNEXUS_SQLITE_PATH=str(workdir / "db.sqlite3"),
        TOOLNEXUS_AGENT_MODULES="e2e_typed_agents",
        PYTHONPATH=os.pathsep.join(p for p in (str(workdir), env.get("PYTHONPATH")) if p),
    )
    port = _free_port()
    typed = App(f"http://127.0.0.1:{port}", app.password, env, "embedded")
    try:
        typed.start("serve", ["serve", "--port", str(port)], workdir)
        typed.wait_ready()
        yield typed
    finally:
        typed.stop()
        for name, _, log in typed.processes:
            shutil.copyfile(log, artifacts / f"typed-app-{name}.log")


@pytest.fixture(scope="module")
def typed_api(typed_app: App) -> Iterator[httpx.Client]:
    """`typed_app`'s JSON API as `reviewer`."""
    token = typed_app.manage("api_token", "reviewer", "--name", "e2e-t").strip().splitlines()[-1]
    with httpx.Client(
        base_url=typed_app.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:
        yield client


def halted_many(api: httpx.Client, prompts: list[str]) -> list[str]:
    """Start every run first, then wait for each: their request ids, in prompt order."""
    run_ids = [start_run(api, prompt) for prompt in prompts]
    return [wait_run(api, run_id, "pending")["pending"]["request"]["id"] for run_id in run_ids]


def halted_on(api: httpx.Client, agent: str, prompt: str) -> tuple[int, str]:
    """A run of `agent` started through the API and halted: (run id, its request's id)."""
    response = api.post("/api/runs", json={"agent": agent, "prompt": prompt})
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    return run_id, wait_run(api, run_id, "pending")["pending"]["request"]["id"]


def open_triage(page: Page, app: App, query: str) -> None:
    page.goto(app.url(f"/?{query}"))
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    expect(page.locator("#triage-tools")).to_be_visible()  # inbox-keys.js is running


def row_of(page: Page, request_id: str):
    return page.locator(f'#request-rows li.row[data-request-id="{request_id}"]')


def detail_card(page: Page, request_id: str):
    return page.locator(f'#detail article.card[data-request-id="{request_id}"]')


def state_of(api: httpx.Client, request_id: str) -> dict:
    return api.get(f"/api/requests/{request_id}").json()


def wait_state(api: httpx.Client, request_id: str, *states: str) -> dict:
    deadline = time.monotonic() + WAIT
    while (found := state_of(api, request_id))["state"] not in states:
        assert time.monotonic() < deadline, f"{request_id} stayed {found['state']}"
        time.sleep(0.1)
    return found


def cursor_id(page: Page) -> str | None:
    return page.evaluate(
        "() => { const r = document.querySelector('#request-rows li.row.kb-cursor');"
        " return r ? r.dataset.requestId : null; }"
    )


# What inbox-keys.js does after a live message about the open request: the claim bar again.
REFRESH_CLAIM_BAR = """() => {
  const bar = document.querySelector('#detail .claim-bar');
  htmx.ajax('GET', bar.dataset.url, { target: bar, swap: 'outerHTML' });
}"""


# A reload of the open card (app.js's "Reload it"), counted once it has swapped in.
RELOAD_CARD = """id => {
  const card = document.querySelector('#detail article.card');
  window.__reloads = (window.__reloads || 0) + 1;
  const root = document.querySelector('.approvals-app').dataset.appRoot;
  htmx.ajax('GET', root + 'requests/' + encodeURIComponent(id) + '/card/', { target: card, swap: 'outerHTML' })
    .then(() => { window.__reloaded = window.__reloads; });
}"""
RELOADED = "() => window.__reloaded === window.__reloads"


def blur(page: Page) -> None:
    page.evaluate("() => document.activeElement && document.activeElement.blur()")


# -- keys ----------------------------------------------------------------------------------


def test_keys_move_open_approve_decline_select_search_and_help(app, api, contexts, shoot):
    t = tag()
    ids = halted_many(api, [f"Refund order K-{n}, ${n} (keys {t})" for n in (1, 2, 3)])
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&sort=oldest")
    for request_id in ids:
        expect(row_of(page, request_id)).to_be_visible()
    blur(page)

    # the keys are shown: hints on the buttons, a "? keys" link and the list itself
    page.keyboard.press("Enter")
    expect(detail_card(page, ids[0])).to_be_visible()
    expect(page.locator("#detail .key-hint").first).to_be_visible()
    page.keyboard.press("?")
    dialog = page.locator("#keys-help")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("approve")
    shoot(page, "1-help")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()

    # while a request is open, j/k open the row they reach (one key per request passed);
    # the cursor never goes back to a row whose load answered after the next key
    page.keyboard.press("j")
    assert cursor_id(page) == ids[1]
    expect(detail_card(page, ids[1])).to_be_visible()
    page.keyboard.press("j")
    page.keyboard.press("j")  # stays on the last row
    assert cursor_id(page) == ids[2]
    expect(detail_card(page, ids[2])).to_be_visible()
    page.keyboard.press("k")
    page.keyboard.press("k")
    assert cursor_id(page) == ids[0]
    expect(detail_card(page, ids[0])).to_be_visible()
    assert cursor_id(page) == ids[0]

    # x selects the row under the cursor for a bulk decision, and again clears it
    page.keyboard.press("x")
    expect(row_of(page, ids[0]).locator("input.row-select")).to_be_checked()
    expect(page.locator("#bulk-count")).to_have_text("1 selected")
    page.keyboard.press("x")
    expect(row_of(page, ids[0]).locator("input.row-select")).not_to_be_checked()

    # a approves the open request; the next one opens by itself
    page.keyboard.press("a")
    wait_state(api, ids[0], "approved")
    expect(detail_card(page, ids[1])).to_be_visible()
    assert cursor_id(page) == ids[1]

    # d goes to the reason; Shift+Enter is a new line, Enter declines
    page.keyboard.press("d")
    reason = page.locator(f'#detail article.card[data-request-id="{ids[1]}"] textarea[name=reason]')
    expect(reason).to_be_focused()
    page.keyboard.type("not this one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("(second line)")
    page.keyboard.press("j")  # typing: it is a letter, no key fires
    assert cursor_id(page) == ids[1]
    page.keyboard.press("Backspace")
    page.keyboard.press("Enter")
    declined = wait_state(api, ids[1], "declined")
    assert declined["decision"]["reason"] == "not this one\n(second line)"
    expect(detail_card(page, ids[2])).to_be_visible()
    shoot(page, "2-after-decline")

    # / goes to the search box; Escape leaves it and the keys work again
    page.keyboard.press("/")
    expect(page.locator("#inbox-search")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("#inbox-search")).not_to_be_focused()
    page.keyboard.press("e")
    expect(page.locator("#detail details.edit")).to_have_attribute("open", "")
    page.keyboard.press("Escape")
    page.keyboard.press("d")
    expect(page.locator("#detail form.decline textarea[name=reason]")).to_be_focused()
    assert state_of(api, ids[2])["state"] == "pending"


def test_j_never_leaves_an_open_request_with_typed_text(app, api, contexts):
    """j opens the row it reaches, but not away from a request the reviewer typed in: the
    cursor alone moves, a note says how to open the row, and the text stays."""
    t = tag()
    ids = halted_many(api, [f"Refund order T-{n}, ${n} (typed {t})" for n in (1, 2)])
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&sort=oldest&r={ids[0]}")
    expect(detail_card(page, ids[0])).to_be_visible()
    blur(page)
    page.keyboard.press("d")
    reason = detail_card(page, ids[0]).locator("textarea[name=reason]")
    expect(reason).to_be_focused()
    page.keyboard.type("half a reason")
    page.keyboard.press("Escape")
    page.keyboard.press("j")
    assert cursor_id(page) == ids[1]
    expect(page.locator("#toasts .keys-note")).to_contain_text("keeps what you typed")
    expect(detail_card(page, ids[0])).to_be_visible()
    expect(reason).to_have_value("half a reason")
    page.keyboard.press("Enter")  # the reviewer's own choice: open it
    expect(detail_card(page, ids[1])).to_be_visible()
    assert state_of(api, ids[0])["state"] == "pending"


def test_keys_answer_a_question_and_claim_then_release(app, api, contexts, shoot):
    t = tag()
    _, request_id = halted_run(api, f"Please ask the customer a question ({t})")
    page = login(contexts(), app, "reviewer")
    toggles = []  # the claim bar's posts, in order
    page.on(
        "request",
        lambda r: (
            r.method == "POST"
            and (found := re.search(r"/(claim|release)/$", r.url))
            and toggles.append(found.group(1))
        ),
    )
    open_triage(page, app, f"q={t}&r={request_id}")
    card = detail_card(page, request_id)
    expect(card).to_be_visible()
    blur(page)

    page.keyboard.press("c")
    bar = page.locator("#detail .claim-bar")
    expect(bar).to_contain_text("Claimed by you")
    page.keyboard.press("c")
    expect(bar).to_contain_text("Unclaimed")
    assert state_of(api, request_id)["claim"] is None

    # c acts on the claim bar in the page when it acts: pressed while the bar htmx just
    # swapped in is not wired yet (a long settle here) and a refresh (a live update) swaps
    # it again, the click lands on the new bar, never on the detached one (a lost release)
    page.evaluate("() => { htmx.config.defaultSettleDelay = 1500; }")
    page.keyboard.press("c")
    expect(bar).to_contain_text("Claimed by you")
    page.keyboard.press("c")  # the bar from the claim's answer: not wired for 1.5 s
    page.evaluate(REFRESH_CLAIM_BAR)
    expect(bar).to_contain_text("Unclaimed")
    assert state_of(api, request_id)["claim"] is None

    # every press is one toggle, in order: none lost, none done twice
    assert toggles == ["claim", "release", "claim", "release"], toggles
    for _ in range(3):
        page.keyboard.press("c")
    deadline = time.monotonic() + WAIT
    while len(toggles) < 7:
        assert time.monotonic() < deadline, toggles
        page.wait_for_timeout(50)
    expect(bar).to_contain_text("Claimed by you")
    page.wait_for_timeout(500)  # a fourth toggle, had there been one, would be sent by now
    assert toggles[4:] == ["claim", "release", "claim"], toggles
    expect(bar).to_contain_text("Claimed by you")
    assert state_of(api, request_id)["claim"]["by"] == "reviewer"
    page.keyboard.press("c")
    expect(bar).to_contain_text("Unclaimed")
    assert state_of(api, request_id)["claim"] is None

    page.evaluate("() => { htmx.config.defaultSettleDelay = 20; }")

    # a needs an answer here: it goes to the first choice; Space picks it, Enter sends
    page.keyboard.press("a")
    expect(card.locator('[name="q.0"]').first).to_be_focused()
    page.keyboard.press("Space")
    page.keyboard.press("Enter")
    answered = wait_state(api, request_id, "answered")
    assert answered["state"] == "answered"
    shoot(page, "answered")


def test_the_approve_key_acts_on_the_card_in_the_page_after_swaps(app, api, contexts):
    """a pressed while the card htmx just swapped in is not wired yet, and a swap (a live
    update, a reload) replaces it again: the approval is sent once, from the card in the page."""
    t = tag()
    _, request_id = halted_run(api, f"Refund order R-1, $1 (reswap {t})")
    page = login(contexts(), app, "reviewer")
    decisions = []
    page.on(
        "request",
        lambda r: r.method == "POST" and r.url.endswith("/approve/") and decisions.append(r.url),
    )
    open_triage(page, app, f"q={t}&r={request_id}")
    card = detail_card(page, request_id)
    expect(card).to_be_visible()
    blur(page)

    page.evaluate("() => { htmx.config.defaultSettleDelay = 1500; }")
    page.evaluate(RELOAD_CARD, request_id)  # a fresh card: not wired for 1.5 s
    page.wait_for_function(RELOADED)
    page.keyboard.press("a")
    page.evaluate(RELOAD_CARD, request_id)  # and again, while a waits
    wait_state(api, request_id, "approved")
    page.wait_for_timeout(500)
    assert len(decisions) == 1, decisions


# -- r: a typed result or answer, never the decline reason ----------------------------------


def test_r_goes_to_a_questions_own_answer_and_enter_sends_it(app, api, contexts, shoot):
    """A question with options takes a typed answer too ("Other"), as a person would give
    one: r goes to its box with "Other" chosen, typing is the answer, Enter sends it."""
    t = tag()
    _, request_id = halted_run(api, f"Please ask the customer a question (answer {t})")
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&r={request_id}")
    card = detail_card(page, request_id)
    expect(card).to_be_visible()
    blur(page)

    page.keyboard.press("r")
    other = card.locator('[name="q.0.other"]')
    expect(other).to_be_focused()
    expect(card.locator('[name="q.0"][data-other]')).to_be_checked()
    expect(page.locator("#toasts .keys-note")).to_have_count(0)
    page.keyboard.type("enterprise, from March")
    shoot(page, "answer")
    page.keyboard.press("Enter")
    answered = wait_state(api, request_id, "answered", "declined")
    assert answered["state"] == "answered"
    assert answered["decision"]["answer"]["data"]["answers"] == {
        "Which plan should the customer move to?": "enterprise, from March"
    }


def test_a_typed_answer_chooses_other_and_an_option_chosen_after_it_wins(app, api, contexts):
    """Typing into the box chooses "Other" (a click there, no key); choosing an option after
    it sends the option: the radio decides, the box's text is not sent."""
    t = tag()
    _, request_id = halted_run(api, f"Please ask the customer a question (other {t})")
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&r={request_id}")
    card = detail_card(page, request_id)
    card.locator('[name="q.0.other"]').fill("maybe later")
    expect(card.locator('[name="q.0"][data-other]')).to_be_checked()
    card.locator('[name="q.0"][value="basic"]').check()
    card.get_by_role("button", name=re.compile(r"^Send answer")).click()
    answered = wait_state(api, request_id, "answered", "declined")
    assert answered["decision"]["answer"]["data"]["answers"] == {
        "Which plan should the customer move to?": "basic"
    }


def test_r_returns_a_typed_result_where_the_agent_allows_one(typed_app, typed_api, contexts, shoot):
    """`demo-typed` runs refund on the host once approved, or takes the reviewer's typed
    result instead: the single-call card offers both, and r goes to the result, whose Enter
    returns it (answered with that output, never a decline). In the two-call form r picks
    that call's "Return this result"."""
    t = tag()

    def halted(prompt: str) -> tuple[int, str]:
        return halted_on(typed_api, "demo-typed", prompt)

    run_id, request_id = halted(f"Refund order T-1, $5 (typed {t})")
    page = login(contexts(), typed_app, "reviewer")
    open_triage(page, typed_app, f"q={t}&r={request_id}")
    card = detail_card(page, request_id)
    expect(card).to_be_visible()
    expect(card.get_by_role("button", name=re.compile(r"^Approve\b"))).to_be_visible()
    expect(card.get_by_role("button", name=re.compile(r"^Return this result\b"))).to_be_visible()
    blur(page)

    page.keyboard.press("r")
    result = card.locator("form.result-form textarea[name=output]")
    expect(result).to_be_focused()
    expect(card.locator("textarea[name=reason]")).not_to_be_focused()
    page.keyboard.type("refunded in the shop")
    shoot(page, "1-single-call")
    page.keyboard.press("Enter")
    found = wait_state(typed_api, request_id, "answered", "declined", "approved")
    assert found["state"] == "answered"
    assert [(c["decision"], c["output"]) for c in found["calls"]] == [
        ("output", "refunded in the shop")
    ]
    assert "refunded in the shop" in wait_run(typed_api, run_id, "done")["text"]

    # two calls in one turn: r goes to the first result field and picks its "Return this result"
    _, two = halted(f"Refund order T-2, $6 and email the customer (typed {t})")
    open_triage(page, typed_app, f"q={t}&r={two}")
    card = detail_card(page, two)
    expect(card.locator("fieldset.call-decision")).to_have_count(2)
    expect(card.locator('[name="decision.call_refund"][value="approve"]')).to_be_checked()
    blur(page)
    page.keyboard.press("r")
    expect(card.locator('textarea[name="output.call_refund"]')).to_be_focused()
    expect(card.locator('[name="decision.call_refund"][value="output"]')).to_be_checked()
    page.keyboard.type("refunded by hand")
    card.locator('textarea[name="output.call_email"]').fill("mailed by hand")
    shoot(page, "2-two-calls")
    card.get_by_role("button", name=re.compile(r"^Submit decisions\b")).click()
    found = wait_state(typed_api, two, "answered", "declined", "approved")
    assert found["state"] == "answered"
    assert {c["name"]: (c["decision"], c["output"]) for c in found["calls"]} == {
        "refund": ("output", "refunded by hand"),
        "send_email": ("output", "mailed by hand"),
    }


def test_r_on_a_multi_call_card_with_no_typed_result_says_to_decide_each_call(
    typed_app, typed_api, contexts, shoot
):
    """`demo-exec`'s two-call turn: both tools run on the host and neither takes a typed
    result. The card decides each call in one form and has no approve form (a approves
    every call), so r says to choose each call's decision and names the form's button as shown."""
    t = tag()
    _, request_id = halted_on(
        typed_api, "demo-exec", f"Refund order E-1, $4 and email them (exec {t})"
    )
    page = login(contexts(), typed_app, "reviewer")
    open_triage(page, typed_app, f"q={t}&r={request_id}")
    card = detail_card(page, request_id)
    expect(card.locator("fieldset.call-decision")).to_have_count(2)
    expect(card.locator("[data-respond]")).to_have_count(0)  # no typed result anywhere
    expect(card.get_by_role("button", name=re.compile(r"^Approve\b"))).to_have_count(0)
    blur(page)

    page.keyboard.press("r")
    expect(page.locator("#toasts .keys-note")).to_have_text(
        "No call here takes a typed result: choose each call's decision, then press"
        " “Submit decisions”."
    )
    shoot(page, "multi-call-no-typed-result")
    assert page.evaluate("() => document.activeElement.tagName") not in ("TEXTAREA", "INPUT")
    assert state_of(typed_api, request_id)["state"] == "pending"


def test_r_on_a_request_that_takes_no_typed_result_says_so_and_declines_nothing(
    app, api, contexts, shoot
):
    """The demo's refund runs on the host once approved and its agent takes no typed result:
    r does not go to the decline reason (where Enter declines), it says so. That Enter sent
    nothing is shown without a fixed wait: c, pressed after it, claims the request (keys act
    in order, so a decline Enter sent would have left first), and once that claim is answered
    the browser has sent no decline and the request is pending, claimed by this reviewer."""
    t = tag()
    _, request_id = halted_run(api, f"Refund order N-1, $3 (no result {t})")
    page = login(contexts(), app, "reviewer")
    posts = []  # every POST this page sends, in the order the browser sends them
    page.on("request", lambda r: r.method == "POST" and posts.append(r.url))
    open_triage(page, app, f"q={t}&r={request_id}")
    card = detail_card(page, request_id)
    expect(card).to_be_visible()
    blur(page)

    page.keyboard.press("r")
    note = page.locator("#toasts .toast", has_text="takes no typed result")
    expect(note).to_be_visible()
    shoot(page, "no-typed-result")
    expect(card.locator("textarea[name=reason]")).not_to_be_focused()
    assert page.evaluate("() => document.activeElement.tagName") not in ("TEXTAREA", "INPUT")

    page.keyboard.press("Enter")
    with page.expect_response(lambda r: r.url.endswith(f"/{request_id}/claim/")) as claimed:
        page.keyboard.press("c")
    assert claimed.value.ok
    claim_url = claimed.value.request.url
    assert [url for url in posts if url.endswith(("/decline/", "/claim/"))] == [claim_url], posts
    expect(page.locator("#detail .claim-bar")).to_contain_text("Claimed by you")
    found = state_of(api, request_id)
    assert found["state"] == "pending" and found["claim"]["by"] == "reviewer"
    expect(card.locator("form.decline")).to_be_visible()  # the card is still open, undecided


# -- bulk ----------------------------------------------------------------------------------


def test_bulk_approve_and_decline_with_per_request_results(app, api, api2, contexts, shoot):
    t = tag()
    ids = halted_many(api, [f"Refund order B-{n}, ${n} (bulk {t})" for n in range(1, 6)])
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&sort=oldest")
    for request_id in ids:
        expect(row_of(page, request_id)).to_be_visible()

    # select the first three: a click, then a shift-click for the range
    row_of(page, ids[0]).locator("input.row-select").click()
    row_of(page, ids[2]).locator("input.row-select").click(modifiers=["Shift"])
    expect(page.locator("#bulk-count")).to_have_text("3 selected")
    for request_id in ids[:3]:
        expect(row_of(page, request_id).locator("input.row-select")).to_be_checked()

    # reviewer2 declines the second one just as the bulk approve leaves the browser
    def race(route):
        response = api2.post(f"/api/requests/{ids[1]}/decline", json={"reason": "mine"})
        assert response.status_code == 200, response.text
        route.continue_()

    page.route("**/requests/bulk/", race)
    page.get_by_role("button", name="Approve selected").click()
    result = page.locator("#bulk-result")
    expect(result).to_contain_text("2 of 3 approved.")
    expect(result.locator(".bulk-done")).to_have_count(2)
    expect(result.locator(f'.bulk-already[data-request-id="{ids[1]}"]')).to_contain_text(
        "reviewer2"
    )
    shoot(page, "1-bulk-approve")
    assert state_of(api, ids[0])["state"] == state_of(api, ids[2])["state"] == "approved"
    assert state_of(api, ids[1])["decision"]["decided_by"] == "reviewer2"

    # the rest, declined with one reason
    page.unroute("**/requests/bulk/")
    expect(row_of(page, ids[0])).to_have_count(0)
    for request_id in ids[3:]:
        row_of(page, request_id).locator("input.row-select").click()
    expect(page.locator("#bulk-count")).to_have_text("2 selected")
    page.fill("#bulk-reason", f"batch {t}")
    page.get_by_role("button", name="Decline selected").click()
    expect(result).to_contain_text("2 of 2 declined.")
    shoot(page, "2-bulk-decline")
    for request_id in ids[3:]:
        found = state_of(api, request_id)
        assert found["state"] == "declined" and found["decision"]["reason"] == f"batch {t}"


# The list drawn again at the page's URL (as after a bulk decision or a reconnect), awaited.
REDRAW_LIST = """() => {
  const list = document.getElementById('request-list');
  list.dataset.e2eOld = '1';
  return htmx.ajax('GET', location.pathname + location.search, { target: list, swap: 'outerHTML' });
}"""


def test_bulk_decline_of_all_requests_matching_a_search(app, api, contexts, shoot):
    """The "all N matching" choice decides what the list's filters match (the search typed
    last), not the rows on screen: the matching requests are declined with the one reason,
    the others stay pending. It stays chosen while the list is drawn again with nothing new;
    a matching request that arrives (live, on top of the list) unchecks it, and the reviewer
    chooses it again on the list drawn with it."""
    t = tag()
    which = ["yes", "yes", "yes", "no", "no"]
    prompts = [f"Refund order M-{n}, ${n} (all {t} {w})" for n, w in enumerate(which, 1)]
    ids = halted_many(api, prompts)
    matching, others = ids[:3], ids[3:]
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&sort=oldest")
    for request_id in ids:
        expect(row_of(page, request_id)).to_be_visible()
    all_matching = page.locator("label.bulk-all")
    expect(all_matching).to_contain_text("all 5 matching")

    page.fill("#inbox-search", f"{t} yes")
    for request_id in others:
        expect(row_of(page, request_id)).to_have_count(0)
    expect(all_matching).to_contain_text("all 3 matching")
    page.locator("#bulk-all").check()
    count = page.locator("#bulk-count")
    expect(count).to_have_text("All matching requests selected")
    upto = page.locator("#bulk-form input[name=upto]")
    drawn = int(upto.input_value())
    moment = page.locator("#bulk-form input[name=drawn]")
    chosen_at = moment.input_value()

    page.evaluate(REDRAW_LIST)  # nothing new: still chosen, for the same requests
    expect(page.locator("#request-list[data-e2e-old]")).to_have_count(0)
    expect(page.locator("#bulk-all")).to_be_checked()
    expect(count).to_have_text("All matching requests selected")
    expect(upto).to_have_value(str(drawn))
    expect(moment).to_have_value(chosen_at)  # as at the list it was chosen on

    _, late = halted_run(api, f"Refund order M-6, $6 (all {t} yes)")
    expect(row_of(page, late)).to_be_visible()
    expect(page.locator("#bulk-all")).not_to_be_checked()
    expect(count).to_have_text("New requests arrived: choose all matching again")
    expect(all_matching).to_contain_text("all 4 matching")  # counted with the live row
    # the list is drawn again with it (a reload after the live row: the counts come first)
    page.wait_for_function(
        "drawn => Number(document.querySelector('#bulk-form input[name=upto]').value) > drawn",
        arg=drawn,
    )
    shoot(page, "all-matching-grew")
    page.locator("#bulk-all").check()
    expect(count).to_have_text("All matching requests selected")
    ids, matching = [*ids, late], [*matching, late]
    page.fill("#bulk-reason", f"not these {t}")
    page.get_by_role("button", name="Decline selected").click()

    result = page.locator("#bulk-result")
    expect(result).to_contain_text("4 of 4 declined.")
    lines = result.locator(".bulk-results li")
    expect(lines).to_have_count(4)
    expect(result.locator(".bulk-done")).to_have_count(4)
    assert sorted(lines.evaluate_all("els => els.map(e => e.dataset.requestId)")) == sorted(
        matching
    )
    shoot(page, "all-matching")

    # what the database holds: the matching three declined with the reason, the others pending
    script = (
        "import json; from approvals.models import ApprovalRequest as R; print(json.dumps({"
        "r.request_id: [r.state, r.reason, r.decided_by.get_username() if r.decided_by else None]"
        f" for r in R.objects.filter(request_id__in={ids!r})}}))"
    )
    stored = json.loads(app.manage("shell", "-c", script).strip().splitlines()[-1])
    assert {i: stored[i] for i in matching} == {
        i: ["declined", f"not these {t}", "reviewer"] for i in matching
    }
    assert {i: stored[i] for i in others} == {i: ["pending", "", None] for i in others}


# -- claims --------------------------------------------------------------------------------


def test_claims_across_two_reviewers_and_taking_over(app, api, contexts, shoot):
    t = tag()
    _, request_id = halted_run(api, f"Refund order C-1, $10 (claim {t})")
    page_a = login(contexts(), app, "reviewer")
    page_b = login(contexts(), app, "reviewer2")
    open_triage(page_a, app, f"q={t}&r={request_id}")
    open_triage(page_b, app, f"q={t}&r={request_id}")
    expect(detail_card(page_a, request_id)).to_be_visible()
    expect(detail_card(page_b, request_id)).to_be_visible()

    blur(page_a)
    page_a.keyboard.press("c")
    expect(page_a.locator("#detail .claim-bar")).to_contain_text("Claimed by you")
    assert state_of(api, request_id)["claim"]["by"] == "reviewer"
    shoot(page_a, "1-claimed-a")

    # B sees it live, in the list and in the open request's claim bar
    expect(row_of(page_b, request_id)).to_contain_text("claimed by reviewer")
    expect(page_b.locator("#detail .claim-bar")).to_contain_text("claimed by reviewer")
    shoot(page_b, "2-claimed-b")

    # B deciding asks to take it over: no means nothing is sent
    blur(page_b)
    questions = []

    def dismiss(dialog):
        questions.append(dialog.message)
        dialog.dismiss()

    page_b.once("dialog", dismiss)
    page_b.keyboard.press("a")
    deadline = time.monotonic() + WAIT
    while not questions:
        assert time.monotonic() < deadline, "B was not asked"
        page_b.wait_for_timeout(50)
    assert "reviewer claimed this request" in questions[0]
    page_b.wait_for_timeout(300)
    assert state_of(api, request_id)["state"] == "pending"

    page_b.once("dialog", lambda dialog: dialog.accept())
    page_b.keyboard.press("a")
    decided = wait_state(api, request_id, "approved")
    assert decided["decision"]["decided_by"] == "reviewer2"
    expect(page_a.locator("#toasts")).to_contain_text("reviewer2")
    shoot(page_b, "3-taken-over")


MARK_ROW = """id => {
  document.querySelector(`#request-rows li.row[data-request-id="${id}"]`).dataset.e2eOld = '1';
}"""
ROW_REDRAWN_AND_SETTLED = """id => {
  const row = document.querySelector(`#request-rows li.row[data-request-id="${id}"]`);
  return row && !row.dataset.e2eOld && !document.querySelector('.htmx-settling, .htmx-swapping');
}"""


def test_c_on_a_row_that_is_not_open_shows_it_loading(app, api, contexts):
    # No request open: j only moves the cursor (with one open, j opens the row it reaches).
    t = tag()
    ids = halted_many(api, [f"Refund order L-{n}, ${n} (loading {t})" for n in (1, 2)])
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&sort=oldest")
    expect(row_of(page, ids[1])).to_be_visible()
    blur(page)
    held = []  # the claim's request, held until the row was seen loading
    page.route("**/claim/", lambda route: held.append(route))
    page.keyboard.press("j")
    assert cursor_id(page) == ids[1]
    page.keyboard.press("c")
    row = row_of(page, ids[1])
    expect(page.locator("#detail article.card")).to_have_count(0)
    # is-claiming, not htmx's own htmx-request: a live redraw of the row keeps it
    expect(row).to_have_class(re.compile(r"\bis-claiming\b"))
    page.wait_for_function(
        "id => getComputedStyle(document.querySelector("
        "`#request-rows li.row[data-request-id=\"${id}\"]`)).opacity === '0.7'",
        arg=ids[1],
    )
    assert len(held) == 1
    # A live update redraws the list while the claim waits: the row is a new element, and
    # once htmx has settled it (its classes are the server's then) it still shows the claim.
    page.evaluate(MARK_ROW, ids[1])
    page.evaluate(REDRAW_LIST)
    page.wait_for_function(ROW_REDRAWN_AND_SETTLED, arg=ids[1])
    expect(row).to_have_class(re.compile(r"\bis-claiming\b"))
    held[0].continue_()
    expect(row).not_to_have_class(re.compile(r"\bis-claiming\b"))
    expect(row).to_contain_text("claimed by reviewer")
    assert state_of(api, ids[1])["claim"]["by"] == "reviewer"


def test_snooze_hides_for_me_only(app, api, contexts, shoot):
    t = tag()
    ids = halted_many(api, [f"Refund order S-{n}, ${n} (snooze {t})" for n in (1, 2)])
    page_a = login(contexts(), app, "reviewer")
    page_b = login(contexts(), app, "reviewer2")
    open_triage(page_a, app, f"q={t}&sort=oldest&r={ids[0]}")
    open_triage(page_b, app, f"q={t}&sort=oldest")
    bar = page_a.locator("#detail .claim-bar")
    expect(bar).to_be_visible()
    bar.locator("select[name=for]").select_option("1h")
    bar.get_by_role("button", name="Snooze").click()
    expect(row_of(page_a, ids[0])).to_have_count(0)
    expect(detail_card(page_a, ids[1])).to_be_visible()  # the next one opened
    shoot(page_a, "1-snoozed")

    page_b.reload()
    expect(row_of(page_b, ids[0])).to_be_visible()  # others still see it
    page_a.goto(app.url(f"/?q={t}"))
    expect(row_of(page_a, ids[0])).to_have_count(0)  # gone for me after a reload too
    page_a.goto(app.url(f"/?q={t}&hidden=only"))
    expect(row_of(page_a, ids[0])).to_be_visible()
    assert state_of(api, ids[0])["state"] == "pending"


# -- title, notifications, sound -------------------------------------------------------------


NOTIFICATIONS_STUB = """
window.__notes = [];
window.Notification = function (title, options) { window.__notes.push(title); };
window.Notification.permission = "granted";
window.Notification.requestPermission = function () { return Promise.resolve("granted"); };
"""


def test_title_count_notifications_and_sound(app, api, contexts, shoot):
    t = tag()
    _, first = halted_run(api, f"Refund order N-1, $1 (notify {t})")
    context = contexts()
    context.add_init_script(NOTIFICATIONS_STUB)
    page = login(context, app, "reviewer")
    open_triage(page, app, f"q={t}")
    expect(row_of(page, first)).to_be_visible()
    count = page.locator("#request-count")
    expect(page).to_have_title(re.compile(r"^\(\d+\) Inbox"))

    # both off by default; switched on, they are kept for the next visit
    notify, sound = page.locator("#notify-toggle"), page.locator("#sound-toggle")
    expect(notify).not_to_be_checked()
    expect(sound).not_to_be_checked()
    notify.check()
    sound.check()
    page.reload()
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    expect(page.locator("#notify-toggle")).to_be_checked()
    expect(page.locator("#sound-toggle")).to_be_checked()
    beeps_before = int(page.locator("#sound-toggle").get_attribute("data-beeps") or 0)

    # the tab is hidden: a request that arrives live notifies, and beeps
    page.evaluate("() => Object.defineProperty(document, 'visibilityState', {get: () => 'hidden'})")
    before = page.title()
    _, second = halted_run(api, f"Refund order N-2, $2 (notify {t})")
    expect(row_of(page, second)).to_be_visible()
    page.wait_for_function("() => window.__notes.length > 0")
    assert "New request" in page.evaluate("() => window.__notes[0]")
    assert int(page.locator("#sound-toggle").get_attribute("data-beeps") or 0) > beeps_before
    pending = int(count.get_attribute("data-pending") or count.get_attribute("data-count"))
    expect(page).to_have_title(re.compile(rf"^\({pending}\) Inbox"))
    assert page.title() != before or pending == 0
    shoot(page, "notified")


# -- a queue cleared with the keyboard alone ---------------------------------------------------


def test_twenty_requests_cleared_with_the_keyboard_only(app, api, contexts, shoot):
    t = tag()
    ids = halted_many(api, [f"Refund order Q-{n}, ${n} (queue {t})" for n in range(1, 21)])
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&sort=oldest")
    for request_id in ids:
        expect(row_of(page, request_id)).to_have_count(1)
    blur(page)
    shoot(page, "1-queue")

    keys = []

    def press(key: str) -> None:
        keys.append(key)
        page.keyboard.press(key)

    per_approval = []
    for n, request_id in enumerate(ids):
        before = len(keys)
        if not detail_card(page, request_id).count():
            press("Enter")  # the first one: open it
            expect(detail_card(page, request_id)).to_be_visible()
        press("a")
        wait_state(api, request_id, "approved")
        if n + 1 < len(ids):
            expect(detail_card(page, ids[n + 1])).to_be_visible()  # opened by itself
        per_approval.append(len(keys) - before)

    shoot(page, "2-cleared")
    assert max(per_approval) <= 3, per_approval
    assert len(keys) <= 3 * len(ids)
    assert len(keys) == len(ids) + 1  # Enter once, then one key per approval
    for request_id in ids:
        assert state_of(api, request_id)["state"] == "approved"


# -- without JavaScript ------------------------------------------------------------------------


def test_claim_snooze_and_bulk_work_without_javascript(app, api, contexts, shoot):
    t = tag()
    ids = halted_many(api, [f"Refund order W-{n}, ${n} (no js {t})" for n in (1, 2, 3)])
    page = login(contexts(java_script_enabled=False), app, "reviewer")
    page.goto(app.url(f"/?q={t}&sort=oldest&r={ids[0]}"))
    expect(page.locator("#triage-tools")).to_be_hidden()  # the keys need JavaScript
    bar = page.locator("#detail .claim-bar")
    bar.get_by_role("button", name="Claim").click()
    page.wait_for_load_state()
    expect(page.locator("#toasts")).to_contain_text("You claimed this request.")
    expect(page.locator("#detail .claim-bar")).to_contain_text("Claimed by you")
    assert state_of(api, ids[0])["claim"]["by"] == "reviewer"
    shoot(page, "1-claimed")

    page.locator("#detail .claim-bar").get_by_role("button", name="Ignore").click()
    page.wait_for_load_state()
    expect(page.locator("#toasts")).to_contain_text("Ignored")
    expect(row_of(page, ids[0])).to_have_count(0)

    for request_id in ids[1:]:
        row_of(page, request_id).locator("input.row-select").check()
    page.fill("#bulk-reason", "not today")
    page.get_by_role("button", name="Decline selected").click()
    page.wait_for_load_state()
    expect(page.locator("#toasts")).to_contain_text("2 of 2 declined.")
    shoot(page, "2-bulk")
    for request_id in ids[1:]:
        assert state_of(api, request_id)["decision"]["reason"] == "not today"
    assert state_of(api, ids[0])["state"] == "pending"


def test_a_on_a_multi_call_card_approves_every_call_unless_the_reviewer_chose(
    typed_app, typed_api, contexts, shoot
):
    """`demo-exec`'s two-call turn, both run by the host: a sends the card's form with each
    call approved. On another such card where the reviewer chose Decline for one call, a
    sends nothing, says to press the form's button, and focuses it: the choice is theirs."""
    t = tag()
    chosen, plain = (
        halted_on(typed_api, "demo-exec", f"Refund order E-{n}, $4 and email (both {t})")[1]
        for n in (1, 2)
    )
    page = login(contexts(), typed_app, "reviewer")

    open_triage(page, typed_app, f"q={t}&r={chosen}")
    card = detail_card(page, chosen)
    expect(card.locator("fieldset.call-decision")).to_have_count(2)
    submit = card.get_by_role("button", name=re.compile(r"^Submit decisions\b"))
    expect(submit.locator(".key-hint")).to_have_text("a")
    card.locator('input[type=radio][value="decline"]').first.check()
    blur(page)
    page.keyboard.press("a")
    expect(page.locator("#toasts .keys-note")).to_have_text(
        "You changed this form (a decision or a text): press “Submit decisions” to send it"
        " as it is."
    )
    expect(submit).to_be_focused()
    expect(card.locator('input[type=radio][value="decline"]').first).to_be_checked()
    shoot(page, "a-multi-call-chosen")
    assert state_of(typed_api, chosen)["state"] == "pending"

    open_triage(page, typed_app, f"q={t}&r={plain}")
    expect(detail_card(page, plain).locator("fieldset.call-decision")).to_have_count(2)
    blur(page)
    page.keyboard.press("a")
    found = wait_state(typed_api, plain, "approved", "declined", "answered")
    assert found["state"] == "approved"
    assert sorted(c["decision"] for c in found["calls"]) == ["approve", "approve"]
    assert state_of(typed_api, chosen)["state"] == "pending"

    # `demo-typed`'s two-call turn: the host does not run send_email, whose result the
    # reviewer types: a goes there (its "Return this result" chosen), as on a single call
    _, typed = halted_on(typed_api, "demo-typed", f"Refund order E-3, $4 and email (both {t})")
    open_triage(page, typed_app, f"q={t}&r={typed}")
    card = detail_card(page, typed)
    expect(card.locator("fieldset.call-decision")).to_have_count(2)
    blur(page)
    page.keyboard.press("a")
    result = card.locator('textarea[name="output.call_email"]')
    expect(result).to_be_focused()
    expect(card.locator('[name="decision.call_email"][value="output"]')).to_be_checked()
    # typed into: the form is the reviewer's now; a says to send it (no dead key)
    page.keyboard.type("mailed by hand")
    page.keyboard.press("Escape")
    blur(page)
    page.keyboard.press("a")
    expect(page.locator("#toasts .keys-note")).to_contain_text("You changed this form")
    expect(card.get_by_role("button", name=re.compile(r"^Submit decisions\b"))).to_be_focused()
    expect(result).to_have_value("mailed by hand")
    # a Decline the reviewer chose on that call stays chosen: a never picks the result over it
    result.fill("")
    card.locator('[name="decision.call_email"][value="decline"]').check()
    blur(page)
    page.keyboard.press("a")
    expect(card.get_by_role("button", name=re.compile(r"^Submit decisions\b"))).to_be_focused()
    expect(card.locator('[name="decision.call_email"][value="decline"]')).to_be_checked()
    assert state_of(typed_api, typed)["state"] == "pending"


# -- decide, next: never a jump ---------------------------------------------------------------


# What the page shows and where the keys go, for a failure's message.
DIAG = """() => ({url: location.search, active: document.activeElement && (document.activeElement.tagName + '#' + document.activeElement.id + '.' + document.activeElement.className + ' ' + (document.activeElement.name||'')),
 cursor: Array.from(document.querySelectorAll('li.row.kb-cursor')).map(r => r.dataset.requestId),
 current: Array.from(document.querySelectorAll('li.row[aria-current]')).map(r => r.dataset.requestId),
 detail: (document.querySelector('#detail article.card')||{dataset:{}}).dataset.requestId,
 loading: document.querySelector('#detail-loading') && getComputedStyle(document.querySelector('#detail-loading')).display,
 toasts: document.querySelector('#toasts').innerText})"""


# The row under the keyboard's cursor shows in the detail pane, or no row has the cursor.
CURSOR_OPEN_OR_GONE = """() => {
  const row = document.querySelector('#request-rows li.row.kb-cursor');
  const card = document.querySelector('#detail article.card');
  return !row || (card && card.dataset.requestId === row.dataset.requestId);
}"""


def _rows_now(page: Page) -> list[str]:
    return page.evaluate(
        "() => Array.from(document.querySelectorAll('#request-rows li.row'))"
        ".map(r => r.dataset.requestId)"
    )


@pytest.mark.parametrize("attempt", range(5))
def test_the_refunds_of_a_mixed_list_are_approved_by_keys_while_another_reviewer_decides(
    app, api, api2, contexts, shoot, attempt
):
    """10 refunds and 10 questions, alternating: the refunds are approved with the keyboard
    alone, each approval opening the request below the approved one as the list stood when
    `a` was pressed (never the top of the list), while reviewer2 declines questions (live
    updates that often take rows out before the approve's answer is handled). `a` on a
    question says why it approves nothing. Keys: Enter once, one `a` per refund, and for a
    question in the way one `j`, which opens the refund below it (issue 33's goal: 21 keys)."""
    import threading

    t = tag()
    kinds: dict[str, str] = {}
    for n in range(10):
        refund = halted_many(api, [f"Refund order M-{n}, ${n + 1} (mix {t})"])[0]
        question = halted_many(api, [f"Please ask a question (mix {t} {n})"])[0]
        kinds[refund], kinds[question] = "refund", "question"
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&sort=oldest")
    expect(page.locator("#request-rows li.row")).to_have_count(20)
    blur(page)

    # reviewer2 declines every other question: the rest stay above the refunds approved
    # after them, where a jump to the top of the list would land
    questions = [i for i, kind in kinds.items() if kind == "question"][::2]
    stop = threading.Event()

    def other_reviewer() -> None:  # declines the questions, one every few tenths of a second
        for request_id in questions:
            if stop.wait(0.35):
                return
            api2.post(f"/api/requests/{request_id}/decline", json={"reason": "not now"})

    keys: list[str] = []

    def press(key: str) -> None:
        keys.append(key)
        page.keyboard.press(key)

    def open_id() -> str | None:
        card = page.locator("#detail article.card[data-request-id]")
        return card.first.get_attribute("data-request-id") if card.count() else None

    first = _rows_now(page)[0]
    press("Enter")
    expect(detail_card(page, first)).to_be_visible()
    if kinds[first] == "question":  # a here says why it does nothing
        page.keyboard.press("a")  # not counted: it only checks the note
        expect(page.locator("#toasts .keys-note")).to_contain_text("needs an answer")
        blur(page)
    # Each approve's answer is held until the live update has taken the row out: the order
    # that made the next request the top of the list.
    held: list = []
    page.route("**/approve/", lambda route: held.append((route, route.fetch())))
    worker = threading.Thread(target=other_reviewer, daemon=True)
    worker.start()
    approved: list[str] = []
    missed: list[dict] = []  # page states where an `a` that should open a row did not
    try:
        while len(approved) < 10:
            assert len(keys) <= 21, (" ".join(keys), len(approved))
            current = cursor_id(page)
            assert current is not None, (keys, approved)
            if kinds.get(current) != "refund" or state_of(api, current)["state"] != "pending":
                # to the nearest refund still listed, as a person would (a row the other
                # reviewer's decision took out meanwhile may have moved the cursor on)
                listed = _rows_now(page)
                left = [i for i in listed if kinds.get(i) == "refund" and i not in approved]
                at = listed.index(current) if current in listed else 0
                press("j" if left and listed.index(left[0]) > at else "k")
                # j/k open the row they reach (a request is open): wait until it shows, or
                # the cursor's row left the list meanwhile
                page.wait_for_function(CURSOR_OPEN_OR_GONE)
                continue
            if open_id() != current:
                press("a")  # opens the refund under the cursor (a second a approves it)
                try:
                    expect(detail_card(page, current)).to_be_visible(timeout=5000)
                except AssertionError:
                    # Seen once in ~40 runs under load in the split topology: the open did
                    # not happen. A person presses again; the page's state is kept here.
                    state = page.evaluate(DIAG)
                    press("a")
                    try:
                        expect(detail_card(page, current)).to_be_visible()
                    except AssertionError as failed:
                        raise AssertionError(f"a opened nothing twice: {state}") from failed
                    missed.append(state)
                continue
            listed = _rows_now(page)
            press("a")
            expect(row_of(page, current)).to_have_count(0)  # the live update came first
            wait_state(api, current, "approved")
            for _ in range(200):  # the route handler's fetch returns: Playwright's events run
                if held:
                    break
                page.wait_for_timeout(25)
            route, response = held.pop()
            route.fulfill(response=response)
            approved.append(current)
            if len(approved) == 10:
                break
            # the next request opens by itself: one listed below the approved one when `a`
            # was pressed (the first such still pending), never one above it
            page.wait_for_function(
                "id => { const c = document.querySelector('#detail article.card');"
                " return c && c.dataset.requestId && c.dataset.requestId !== id; }",
                arg=current,
            )
            assert open_id() in listed[listed.index(current) + 1 :], (open_id(), current, listed)
    finally:
        stop.set()
        worker.join(timeout=10)
    shoot(page, f"mixed-{attempt}")
    assert len(missed) <= 1, missed
    assert sorted(approved) == sorted(i for i, kind in kinds.items() if kind == "refund")
    # Enter, an a per refund, and a j for each of the 9 gaps a question may stand in (it
    # opens the refund it reaches); 21 with a question on top of the list
    assert len(keys) <= 21, keys


def test_rows_read_apart_and_snooze_ignore_and_bulk_say_what_they_did(app, api, contexts, shoot):
    """Issue 33, "tell apart, read, and confirm": two question rows of different runs read
    apart (what each run was asked); the cursor frame leaves the list when a search draws it
    anew; Snooze and Ignore are confirmed in a toast; the bulk reason empties once sent."""
    t = tag()
    asks = [f"Please ask about the move to pro ({t} alpha)", f"Please ask the owner ({t} beta)"]
    questions = halted_many(api, asks)
    refunds = halted_many(api, [f"Refund order G-{n}, ${n} (gist {t})" for n in (1, 2, 3)])
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&sort=oldest")
    for request_id, prompt in zip(questions, asks, strict=True):
        expect(row_of(page, request_id).locator(".row-gist")).to_have_text(f"asked: “{prompt}”")
    blur(page)

    page.keyboard.press("j")
    assert cursor_id(page) == questions[1]
    page.locator("#inbox-search").fill(f"gist {t}")
    expect(page.locator("#request-rows li.row")).to_have_count(3)
    expect(page.locator("#request-rows li.row.kb-cursor")).to_have_count(0)

    row_of(page, refunds[0]).locator("a.row-link").click()
    bar = page.locator("#detail .claim-bar")
    bar.locator("select[name=for]").select_option("1h")
    bar.get_by_role("button", name="Snooze").click()
    expect(page.locator("#toasts")).to_contain_text("Snoozed until")
    expect(detail_card(page, refunds[1])).to_be_visible()
    page.locator("#detail .claim-bar").get_by_role("button", name="Ignore").click()
    expect(page.locator("#toasts")).to_contain_text("Ignored: hidden for you")
    expect(detail_card(page, refunds[2])).to_be_visible()

    row_of(page, refunds[2]).locator("input.row-select").check()
    page.locator("#bulk-reason").fill(f"over budget {t}")
    page.get_by_role("button", name="Decline selected").click()
    expect(page.locator("#bulk-result")).to_contain_text("declined")
    assert wait_state(api, refunds[2], "declined")["decision"]["reason"] == f"over budget {t}"
    expect(page.locator("#bulk-reason")).to_have_value("")
    shoot(page, "confirmed")
