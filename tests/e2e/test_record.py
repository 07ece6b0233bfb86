"""The record in a real browser, on the demo agent, following the reviewer's steps: each
decision reads as it was made (per-call declines, edits, typed results, answers), waiting calls
look waiting, every request has its own page, an edit error keeps what was typed, irreversible
actions are confirmed first, and titles built from model-chosen arguments stay text."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from .test_inbox import (
    BUTTON,
    HOSTILE_IMG,
    card_of,
    halted_run,
    login,
    no_xss,
    open_inbox,
    tag,
    wait_run,
)

pytestmark = pytest.mark.e2e


def step_of(page: Page, tool: str):
    """The transcript's result step of one tool on the run page."""
    return page.locator("li.step-tool_result").filter(
        has=page.locator(".who code", has_text=re.compile(rf"^{tool}$"))
    )


def test_a_per_call_decline_reads_declined_and_the_approved_call_approved(
    app, api, contexts, shoot
):
    run_id, request_id = halted_run(api, f"Refund A-2002 $40 and email the customer ({tag()})")
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    card = card_of(page, request_id)
    email = card.locator("fieldset.call-decision").filter(has_text="send_email")
    email.get_by_label("Decline", exact=True).check()
    reason = f"wrong address {tag()}"
    email.locator("input[name^=reason]").fill(reason)
    card.get_by_role("button", name=re.compile(r"^Submit decisions")).click()
    wait_run(api, run_id, "done")

    page.goto(app.url(f"/runs/{run_id}/"))
    email_step, refund_step = step_of(page, "send_email"), step_of(page, "refund")
    expect(email_step.locator(".outcome")).to_contain_text("Declined by reviewer")
    expect(email_step.locator(".outcome")).to_contain_text(reason)
    expect(email_step.locator(".outcome")).not_to_contain_text("Approved")
    expect(refund_step.locator(".outcome")).to_contain_text("Approved by reviewer")
    shoot(page, "run-page")

    page.goto(app.url(f"/requests/{request_id}/"))
    decided = card_of(page, request_id)
    expect(decided.locator(".decided")).to_contain_text("Decided per call by reviewer")
    expect(decided.locator(".call").filter(has_text="send_email")).to_contain_text("Declined")
    shoot(page, "request-page")


def test_submitting_without_typing_the_result_is_refused_and_decides_nothing(
    app, api, contexts, shoot
):
    run_id, request_id = halted_run(api, f"Refund A-2003 $10 and email the customer ({tag()})")
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    card = card_of(page, request_id)
    card.get_by_role("button", name=re.compile(r"^Submit decisions")).click()
    expect(card.locator(".notice.error")).to_contain_text(
        "calls.call_email.output: type the result for send_email"
    )
    shoot(page, "refused")
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "pending"
    assert api.get(f"/api/runs/{run_id}").json()["status"] == "pending"


def test_an_edit_shows_old_and_new_on_the_run_page_and_the_request_page(app, api, contexts, shoot):
    run_id, request_id = halted_run(api, f"Delete account acct-42 ({tag()})")
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    card = card_of(page, request_id)
    card.get_by_text("Edit arguments before approving").click()
    card.get_by_label("account").fill("acct-43")
    card.get_by_role("button", name="Review changes").click()
    page.get_by_role("button", name="Approve with these arguments").click()
    wait_run(api, run_id, "done")

    page.goto(app.url(f"/runs/{run_id}/"))
    outcome = step_of(page, "delete_account").locator(".outcome")
    expect(outcome).to_contain_text("Approved with edits by reviewer")
    expect(outcome.locator("del")).to_have_text('"acct-42"')
    expect(outcome.locator("ins")).to_have_text('"acct-43"')
    shoot(page, "run-page")
    page.goto(app.url(f"/requests/{request_id}/"))
    card = card_of(page, request_id)
    expect(card.locator(".decided")).to_contain_text("Approved with edits by reviewer")
    expect(card.locator(".outcome del")).to_have_text('"acct-42"')
    expect(card.locator(".outcome ins")).to_have_text('"acct-43"')
    expect(page.locator("section.history")).to_contain_text("Approved with edits by reviewer")
    shoot(page, "request-page")
    expect(page.locator("body")).to_contain_text("account acct-43 scheduled for deletion")


def test_a_waiting_call_says_it_waits_and_never_shows_the_engine_placeholder(
    app, api, contexts, shoot
):
    run_id, _ = halted_run(api, f"Refund order A-2004, $12 ({tag()})")
    page = login(contexts(), app, "reviewer")
    page.goto(app.url(f"/runs/{run_id}/"))
    expect(step_of(page, "refund")).to_contain_text("Waiting for a decision")
    expect(page.locator("#run-body")).not_to_contain_text("to the caller for execution")
    shoot(page, "waiting")


def test_question_answers_read_as_answers(app, api, contexts, shoot):
    run_id, request_id = halted_run(api, f"ask a question ({tag()})")
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    card = card_of(page, request_id)
    expect(card.get_by_text("Which plan should the customer move to?")).to_have_count(1)
    card.get_by_label("pro").check()
    card.get_by_role("button", name=re.compile(r"^Send answer")).click()
    wait_run(api, run_id, "done")
    page.goto(app.url(f"/runs/{run_id}/"))
    answers = step_of(page, "question").locator("dl.answers")
    expect(answers.locator("dt")).to_have_text("Plan")
    expect(answers.locator("dd")).to_have_text("pro")
    expect(page.locator("#run-body")).not_to_contain_text('{"answers"')
    page.goto(app.url(f"/requests/{request_id}/"))
    expect(card_of(page, request_id).locator("dl.answers dd")).to_have_text("pro")
    shoot(page, "answered")


def test_every_request_has_a_full_page_to_decide_from(app, api, contexts, shoot):
    run_id, request_id = halted_run(api, f"Refund order A-2005, $18 ({tag()})")
    page = login(contexts(), app, "reviewer")
    page.goto(app.url(f"/requests/{request_id}/"))
    expect(page.get_by_role("navigation", name="Approvals")).to_be_visible()
    expect(page.locator("section.history")).to_contain_text("Request created")
    expect(page.get_by_role("link", name=f"run #{run_id}").first).to_be_visible()
    shoot(page, "pending")
    card = card_of(page, request_id)
    card.locator("textarea[name=reason]").fill("not this one")
    card.get_by_role("button", name=BUTTON["Decline"]).click()
    expect(card_of(page, request_id).locator(".decided")).to_contain_text("Declined by reviewer")
    page.reload()
    expect(page.locator("section.history")).to_contain_text("Declined by reviewer")
    shoot(page, "decided")


def test_an_edit_error_keeps_the_editor_open_with_what_was_typed(app, api, contexts, shoot):
    _, request_id = halted_run(api, f"Refund order A-2006, $25 ({tag()})")
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    card = card_of(page, request_id)
    card.get_by_text("Edit arguments before approving").click()
    card.get_by_label("order").fill("A-2006-typed")
    card.get_by_label("amount").fill("-5")
    card.get_by_role("button", name="Review changes").click()
    card = card_of(page, request_id)
    expect(card.locator(".notice.error")).to_contain_text("amount: must be at least 0")
    expect(card.locator("details.edit")).to_have_attribute("open", "")
    expect(card.get_by_label("order")).to_have_value("A-2006-typed")
    expect(card.get_by_label("amount")).to_have_value("-5")
    shoot(page, "edit-error")


def test_an_irreversible_approval_is_confirmed_first(app, api, contexts, shoot):
    run_id, request_id = halted_run(api, f"Delete account acct-77 ({tag()})")
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    card = card_of(page, request_id)
    dialogs: list[str] = []

    def dismiss(dialog):
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    card.get_by_role("button", name=BUTTON["Approve"]).click()
    deadline = time.monotonic() + 5
    while not dialogs and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert dialogs and "cannot be undone" in dialogs[0]
    page.wait_for_timeout(300)  # a request sent despite the dismissal would land by now
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "pending"

    page.once("dialog", lambda dialog: dialog.accept())
    card.get_by_role("button", name=BUTTON["Approve"]).click()
    wait_run(api, run_id, "done")
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "approved"


def test_an_irreversible_approval_without_javascript_goes_through_a_confirmation_page(
    app, api, contexts, shoot
):
    run_id, request_id = halted_run(api, f"Delete account acct-78 ({tag()})")
    page = login(contexts(java_script_enabled=False), app, "reviewer")
    page.goto(app.url(f"/requests/{request_id}/"))
    card_of(page, request_id).get_by_role("button", name=BUTTON["Approve"]).click()
    expect(page.locator("#confirm-title")).to_contain_text("cannot be undone")
    shoot(page, "confirm")
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "pending"
    page.get_by_role("button", name="Yes, approve").click()
    wait_run(api, run_id, "done")


def test_a_title_built_from_a_hostile_argument_stays_text(app, api, contexts, shoot):
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    run_id, request_id = halted_run(api, f"Delete account {HOSTILE_IMG} ({tag()})")
    card = card_of(page, request_id)  # arrived as a pushed fragment
    expect(card.locator("h2.prompt")).to_contain_text(f"Delete account {HOSTILE_IMG}?")
    no_xss(page)
    shoot(page, "pushed")
    for path in ("/", f"/runs/{run_id}/", f"/requests/{request_id}/"):
        page.goto(app.url(path))
        expect(card_of(page, request_id).locator("h2.prompt")).to_contain_text(HOSTILE_IMG)
        assert page.locator("main img").count() == 0
        no_xss(page)


def test_cards_and_buttons_are_named_for_screen_readers(app, api, contexts):
    _, request_id = halted_run(api, f"Refund order A-2099, $7 ({tag()})")
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    card_of(page, request_id)  # selected: its card in the detail pane
    card = page.get_by_role("article", name="relay call from demo: refund A-2099, 7")
    expect(card).to_have_attribute("data-request-id", request_id)
    expect(card.get_by_role("button", name="Approve refund A-2099")).to_be_visible()
    expect(card.get_by_role("button", name="Decline refund A-2099")).to_be_visible()
