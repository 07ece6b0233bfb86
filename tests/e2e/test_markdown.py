"""Markdown in a real browser: a multi-line prompt keeps its lines and its **bold**, hostile
HTML stays text and never runs, and tool arguments show as a table with the raw JSON one click
away (inbox card and run page)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Locator, Page, expect

from .test_inbox import HOSTILE_IMG, card_of, halted_run, login, open_inbox, tag, wait_run

pytestmark = pytest.mark.e2e


def no_xss(page: Page) -> None:
    assert page.evaluate("typeof window.__xss") == "undefined"


def check_arguments(scope: Locator, order: str, amount: str) -> None:
    """The arguments table is visible; the raw JSON sits closed behind a <details>."""
    table = scope.locator("table.args-table").first
    expect(table).to_be_visible()
    expect(table.locator("tbody tr").filter(has_text="order")).to_contain_text(order)
    expect(table.locator("tbody tr").filter(has_text="amount")).to_contain_text(amount)
    details = scope.locator("details.raw-json").first
    raw = details.locator("pre.json")
    expect(raw).to_be_hidden()
    details.locator("summary", has_text="Raw JSON").click()
    expect(raw).to_be_visible()
    expect(raw).to_contain_text(f'"amount": {amount}')
    expect(raw).to_contain_text(f'"order": "{order}"')


def test_markdown_prompt_keeps_lines_and_bold_and_arguments_show_as_a_table(
    app, api, contexts, shoot
):
    t = tag()
    prompt = f"Refund order A-1009, $35\n**bold {t}** on a second line {HOSTILE_IMG}"
    run_id, request_id = halted_run(api, prompt)

    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    card = card_of(page, request_id)
    expect(card).to_be_visible()
    asked = card.locator(".asked .md")
    expect(asked.locator("strong")).to_have_text(f"bold {t}")
    assert asked.locator("br").count() == 1
    assert "$35\nbold " in asked.inner_text()  # the line break is kept
    expect(asked).to_contain_text(HOSTILE_IMG)  # shown as text
    assert card.locator("img, script").count() == 0
    check_arguments(card, "A-1009", "35")
    shoot(page, "1-inbox")
    no_xss(page)

    # decline with a Markdown reason: the model's reply quotes it, rendered on the run page
    card.locator("textarea[name=reason]").fill(f"**over** the limit {t}")
    card.get_by_role("button", name=re.compile(r"^Decline\b")).click()
    wait_run(api, run_id, "done")

    page.goto(app.url(f"/runs/{run_id}/"))
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    final = page.locator("section.final .md")
    expect(final.locator("strong")).to_have_text("over")
    expect(final).to_contain_text(f"the limit {t}")
    user = page.locator(".step-user .md").first
    expect(user.locator("strong")).to_have_text(f"bold {t}")
    assert "$35\nbold " in user.inner_text()
    expect(user).to_contain_text(HOSTILE_IMG)
    check_arguments(page.locator(".step-tool_call").first, "A-1009", "35")
    assert page.locator("#run-body img, #run-body script").count() == 0
    shoot(page, "2-run-page")
    no_xss(page)
