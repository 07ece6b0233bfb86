"""Browser notifications in a real browser (issue 14): with the permission granted and the
inbox's "Notify me" on, a request that arrives live while the tab is hidden shows a
notification, and a click on it opens that request (`?r=<id>`), listed or not. The real
Notification API runs (the permission is granted to the context); an init script only keeps
the notifications the page makes, to click them. The app runs in subprocesses (conftest.py)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from .test_inbox import halted_run, login, row_of, tag
from .test_triage_keys import detail_card, open_triage

pytestmark = pytest.mark.e2e

# Keeps every notification the page makes (the browser's own objects) in window.__notes.
OBSERVE_NOTIFICATIONS = """
(() => {
  window.__notes = [];
  const Real = window.Notification;
  if (!Real) return;
  function Observed(title, options) {
    const note = new Real(title, options);
    window.__notes.push(note);
    return note;
  }
  Observed.prototype = Real.prototype;
  Object.defineProperty(Observed, "permission", { get: () => Real.permission });
  Observed.requestPermission = (...args) => Real.requestPermission(...args);
  window.Notification = Observed;
})();
"""

HIDE_TAB = """() => Object.defineProperty(document, "visibilityState",
  { configurable: true, get: () => "hidden" })"""
SHOW_TAB = "() => { delete document.visibilityState; }"


def notes(page: Page) -> list[dict]:
    return page.evaluate(
        "() => window.__notes.map(n => ({ title: n.title, body: n.body, tag: n.tag }))"
    )


def click_note(page: Page, index: int) -> None:
    """What the browser does when the reviewer clicks the notification: a click event."""
    page.evaluate(
        "i => window.__notes[i].dispatchEvent(new Event('click', { cancelable: true }))", index
    )


def test_a_notification_for_a_new_request_opens_it_when_clicked(app, api, contexts, shoot):
    t = tag()
    _, first = halted_run(api, f"Refund order N-11, $1 (notes {t})")
    context = contexts()
    context.grant_permissions(["notifications"], origin=app.base_url)
    context.add_init_script(OBSERVE_NOTIFICATIONS)
    page = login(context, app, "reviewer")
    open_triage(page, app, f"q={t}")
    expect(row_of(page, first)).to_be_visible()
    assert page.evaluate("Notification.permission") == "granted"

    # the reviewer turns notifications on (the permission is already granted)
    page.locator("#notify-toggle").check()
    expect(page.locator("#notify-toggle")).to_be_checked()
    page.wait_for_function("() => localStorage.getItem('toolnexus.notify') === '1'")

    # while the tab is visible, a new request shows no notification: the list says it
    _, seen = halted_run(api, f"Refund order N-12, $2 (notes {t})")
    expect(row_of(page, seen)).to_be_visible()
    page.wait_for_timeout(300)
    assert notes(page) == []

    # the tab is hidden: a request created elsewhere (the API, the worker) notifies
    page.evaluate(HIDE_TAB)
    _, second = halted_run(api, f"Refund order N-13, $3 (notes {t})")
    expect(row_of(page, second)).to_be_visible()
    page.wait_for_function("() => window.__notes.length === 1")
    [note] = notes(page)
    assert note["title"].startswith("New request:"), note
    assert "N-13" in note["body"], note
    assert note["tag"] == f"toolnexus-{second}", note
    shoot(page, "1-notified")

    # a click on it brings the tab back with that request open, its id in the URL
    page.evaluate(SHOW_TAB)
    click_note(page, 0)
    expect(detail_card(page, second)).to_be_visible()
    expect(page).to_have_url(re.compile(rf"[?&]r={re.escape(second)}(&|$)"))
    expect(row_of(page, second)).to_have_attribute("aria-current", "true")
    shoot(page, "2-opened")

    # a notification whose request the list no longer shows (other filters since) opens it too
    page.evaluate(HIDE_TAB)
    _, third = halted_run(api, f"Refund order N-14, $4 (notes {t})")
    page.wait_for_function("() => window.__notes.length === 2")
    assert notes(page)[1]["tag"] == f"toolnexus-{third}"
    page.evaluate(SHOW_TAB)
    page.locator("#filter-box > summary").click()  # agent, kind and state: in the menu
    page.select_option("#inbox-filters select[name=kind]", "question")
    expect(page).to_have_url(re.compile(r"[?&]kind=question"))
    expect(row_of(page, third)).to_have_count(0)
    click_note(page, 1)
    expect(detail_card(page, third)).to_be_visible()
    expect(page).to_have_url(re.compile(rf"[?&]r={re.escape(third)}(&|$)"))
    expect(page).to_have_url(re.compile(r"[?&]kind=question"))  # the filters stay
    shoot(page, "3-opened-unlisted")
