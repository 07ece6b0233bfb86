"""The inbox's quick-filter chips count live in a real browser (issue 14): another reviewer's
claim changes the counts without a reload, and a chip the reviewer focused with the keyboard
keeps the focus, as a push replaces the counts only, never the chips' links. The app runs in
subprocesses (see conftest.py)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from .test_inbox import halted_run, login, open_inbox, row_of, tag

pytestmark = pytest.mark.e2e

# Marks the focused chip's element and the page itself: a re-rendered link or a reload would
# lose the marks.
MARK = """() => {
  document.activeElement.dataset.e2eKept = "1";
  window.__notReloaded = true;
}"""
FOCUS_KEPT = """() => document.activeElement !== null
  && document.activeElement.dataset.e2eKept === "1"
  && document.activeElement.matches('#inbox-chips a[data-chip="claim=unclaimed"]')
  && window.__notReloaded === true"""


def chip_count(page: Page, chip: str):
    return page.locator(f'#inbox-chips a[data-chip="{chip}"] .chip-count')


def count_of(page: Page, chip: str) -> int:
    return int(chip_count(page, chip).inner_text())


def test_chip_counts_follow_another_reviewers_claim_and_keep_the_focus(app, api, contexts, shoot):
    _, request_id = halted_run(api, f"Refund order K-1, $4 (chips {tag()})")
    page_a = login(contexts(), app, "reviewer")
    page_b = login(contexts(), app, "reviewer2")
    # every pending request: the list these counts are refreshed for coalesced
    open_inbox(page_a, app)
    open_inbox(page_b, app, f"r={request_id}")
    expect(row_of(page_a, request_id)).to_be_visible()
    unclaimed, mine_a, mine_b = (
        count_of(page_a, "claim=unclaimed"),
        count_of(page_a, "claim=mine"),
        count_of(page_b, "claim=mine"),
    )
    assert unclaimed >= 1

    # reviewer has the "unclaimed" chip focused from the keyboard
    page_a.locator('#inbox-chips a[data-chip="claim=mine"]').focus()
    page_a.keyboard.press("Tab")
    expect(page_a.locator('#inbox-chips a[data-chip="claim=unclaimed"]')).to_be_focused()
    page_a.evaluate(MARK)
    shoot(page_a, "1-focused-chip")

    # reviewer2 claims the request from its claim bar
    page_b.locator("#detail .claim-bar button[data-claim=claim]").click()
    expect(page_b.locator("#detail .claim-bar")).to_contain_text("Claimed by you")

    # reviewer's list says so at once, then the chips count it, with no reload
    expect(row_of(page_a, request_id)).to_contain_text("claimed by reviewer2")
    expect(chip_count(page_a, "claim=unclaimed")).to_have_text(str(unclaimed - 1))
    expect(chip_count(page_a, "claim=mine")).to_have_text(str(mine_a))
    expect(chip_count(page_b, "claim=mine")).to_have_text(str(mine_b + 1))
    assert page_a.evaluate(FOCUS_KEPT), page_a.evaluate(
        "() => document.activeElement && document.activeElement.outerHTML"
    )
    expect(page_a).to_have_url(app.url("/"))  # the list's filters are as they were
    shoot(page_a, "2-counted-focus-kept")
    shoot(page_b, "3-claimer-counts-it")

    # the focused chip still works from the keyboard: Enter filters the list on it
    page_a.keyboard.press("Enter")
    expect(page_a).to_have_url(app.url("/?claim=unclaimed"))
    expect(row_of(page_a, request_id)).to_have_count(0)
