"""What an inbox URL asked that the inbox could not do (an unknown sort, state, claim...)
stays said in a real browser once the page is live: the socket's snapshot re-renders the list
from the cleaned filters, and must not take the notices with it. The app runs in
subprocesses (see conftest.py)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .test_inbox import halted_run, login, row_of, tag

pytestmark = pytest.mark.e2e

# Counts the socket's snapshots of the list (a frame that re-renders #request-list).
COUNT_SNAPSHOTS = """
window.__listSnapshots = 0;
document.addEventListener("htmx:wsAfterMessage", function (e) {
  var message = e.detail && e.detail.message;
  if (typeof message === "string" && message.indexOf('id="request-list"') >= 0) {
    window.__listSnapshots += 1;
  }
});
"""


def test_notices_about_unknown_filter_values_survive_the_live_snapshot(app, api, contexts, shoot):
    t = tag()
    _, request_id = halted_run(api, f"Refund order N-1, $3 (notices {t})")
    context = contexts()
    context.add_init_script(COUNT_SNAPSHOTS)
    page = login(context, app, "reviewer")
    page.goto(app.url(f"/?q={t}&sort=sideways&claim=theirs"))
    notices = page.locator(".filter-notice")
    expect(notices).to_have_count(2)
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    page.wait_for_function("() => window.__listSnapshots >= 1")
    expect(row_of(page, request_id)).to_be_visible()  # the snapshot's list
    expect(notices).to_have_text(
        [
            "Unknown claim “theirs”: showing every request.",
            "Unknown sort “sideways”: showing newest first.",
        ]
    )
    shoot(page, "1-notices-after-snapshot")

    # choosing a known value through the filters (htmx) clears them
    page.select_option("#inbox-filters select[name=sort]", "oldest")
    expect(page).to_have_url(re.compile(r"[?&]sort=oldest(&|$)"))
    expect(notices).to_have_count(0)
    expect(row_of(page, request_id)).to_be_visible()
