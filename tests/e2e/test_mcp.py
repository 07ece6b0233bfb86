"""An MCP server's question in a real browser: the demo's booking flow, whose tool lives in
the MCP server shipped with the app (`approvals.agents.demo_mcp_server`, started over stdio
by the app's worker for each step). The reviewer answers the server's form in the inbox (a
value the form refuses first: the problem is named, what was typed stays), or declines it;
the server's own result, which says what it was answered, reaches the model."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .conftest import WAIT
from .test_inbox import BUTTON, card_of, halted_run, login, open_inbox, row_of, tag, wait_run

pytestmark = pytest.mark.e2e

QUESTION = "Who is the table for?"


def test_a_reviewer_answers_an_mcp_servers_question_in_the_inbox(app, api, contexts, shoot):
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    run_id, request_id = halted_run(api, f"Book a table for tonight at 20:00 ({tag()})")
    request = api.get(f"/api/requests/{request_id}").json()["request"]
    assert request["kind"] == "elicitation" and request["data"]["server"] == "tables"

    card = card_of(page, request_id)
    expect(card).to_be_visible()  # arrived live
    expect(card).to_contain_text(QUESTION)
    expect(card.locator(".badge")).to_have_text("MCP question")
    expect(card.locator(".card-body h3")).to_contain_text("tables · book_table")
    party = card.get_by_label("Party size")
    name = card.get_by_label("Name on the booking")
    shoot(page, "1-question")

    # a value the server's form refuses: nothing is sent, the field is named, typing stays
    party.fill("40")
    name.fill("Ada Lovelace")
    card.get_by_role("button", name=re.compile(r"^Send answer")).click()
    expect(card.locator(".notice.error")).to_contain_text("party_size: must be at most 12")
    expect(card.get_by_label("Party size")).to_have_value("40")
    expect(card.get_by_label("Name on the booking")).to_have_value("Ada Lovelace")
    assert api.get(f"/api/requests/{request_id}").json()["state"] == "pending"
    shoot(page, "2-refused")

    card.get_by_label("Party size").fill("4")
    card.get_by_role("button", name=re.compile(r"^Send answer")).click()
    # decided: gone from the pending list
    expect(row_of(page, request_id)).to_have_count(0, timeout=5_000)
    run = wait_run(api, run_id, "done")
    assert "Booked a table for 4 at Trattoria Demo, 20:00, under Ada Lovelace" in run["text"]

    page.goto(app.url(f"/runs/{run_id}/"))
    body = page.locator("#run-body")
    expect(body.locator("section.final")).to_contain_text("Booked a table for 4")
    expect(body.locator(".step-tool_call").first).to_contain_text("tables · book_table")
    result = body.locator(".step-tool_result").first
    expect(result).to_contain_text("Result of tables · book_table")
    expect(result.locator(".decision-note")).to_contain_text("Answered by reviewer")
    expect(result).to_contain_text("under Ada Lovelace")
    shoot(page, "3-run-page")

    # the request's own page keeps the answer as the form's fields read
    page.goto(app.url(f"/requests/{request_id}/"))
    answered = card_of(page, request_id)
    expect(answered.locator(".answers")).to_contain_text("Party size")
    expect(answered.locator(".answers")).to_contain_text("Ada Lovelace")


def test_a_reviewer_declines_an_mcp_servers_question_and_the_server_hears_decline(
    app, api, contexts, shoot
):
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    run_id, request_id = halted_run(api, f"Please book a table for two ({tag()})")
    card = card_of(page, request_id)
    expect(card).to_contain_text(QUESTION)
    expect(card).to_contain_text("the server is told “decline”")
    card.locator("textarea[name=reason]").fill("we do not book for unnamed guests")
    card.get_by_role("button", name=BUTTON["Decline"]).click()
    expect(row_of(page, request_id)).to_have_count(0, timeout=5_000)

    run = wait_run(api, run_id, "done")
    # the server's own result says what it was answered: `decline` (not `cancel`)
    messages = api.get(f"/api/runs/{run_id}/messages").json()
    result = next(m["content"] for m in messages if m.get("role") == "tool")
    assert result.endswith("No table booked at Trattoria Demo: the guest said decline.")
    assert "the guest said decline" in run["text"]
    decision = api.get(f"/api/requests/{request_id}").json()["decision"]
    assert decision["reason"] == "we do not book for unnamed guests"
    assert decision["answer"]["reason"] == "declined"

    page.goto(app.url(f"/runs/{run_id}/"))
    expect(page.locator(".decision-note")).to_contain_text("Declined by reviewer")
    expect(page.locator("section.final")).to_contain_text(
        "the guest said decline", timeout=WAIT * 1000
    )
    shoot(page, "run-page")
