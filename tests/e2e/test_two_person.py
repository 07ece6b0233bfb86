"""Two-person approval in a real browser: a rule requires two reviewers; the first one's
approval shows live on the second one's page, and the second approval runs the call."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from .test_inbox import BUTTON, card_of, halted_run, login, open_inbox, row_of, tag, wait_run

pytestmark = pytest.mark.e2e


def test_two_reviewers_approve_a_two_of_two_request_and_the_first_shows_live(
    app, api, contexts, shoot
):
    marker = f"dualsign{tag()}"  # the rule covers this run alone (no "two": a demo flow)
    token = app.manage("api_token", "admin", "--name", "e2e-rules").strip().splitlines()[-1]
    admin = httpx.Client(
        base_url=app.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    made = admin.post(
        "/api/rules",
        json={
            "name": f"two people {marker}",
            "position": 0,
            "tool": "refund",
            "effect": "require_approvers",
            "approvals_needed": 2,
            "condition": f'run.prompt.contains("{marker}")',
        },
    )
    assert made.status_code == 201, made.text
    rule_id = made.json()["id"]
    try:
        page_a = login(contexts(), app, "reviewer")
        page_b = login(contexts(), app, "reviewer2")
        run_id, request_id = halted_run(api, f"Refund order A-1001, $250 ({marker})")
        open_inbox(page_a, app, f"r={request_id}")
        page_b.goto(app.url(f"/requests/{request_id}/"))
        expect(page_b.locator("#live[data-ws-open]")).to_have_count(1)
        card_a, card_b = card_of(page_a, request_id), card_of(page_b, request_id)
        expect(card_b.locator(".requirement")).to_contain_text("0 of 2 approved")

        card_a.get_by_role("button", name=BUTTON["Approve"]).click()
        # A's card stays open with the count, and A is told the approval counted (a toast:
        # the card itself may be redrawn by the live push of that same approval)
        expect(card_a.locator(".requirement")).to_contain_text("1 of 2 approved: reviewer")
        expect(page_a.locator("#toasts")).to_contain_text("Your approval counts")
        # B's page follows live: no reload
        expect(card_b.locator(".requirement")).to_contain_text("1 of 2 approved: reviewer")
        shoot(page_b, "1-first-approval-live")
        assert api.get(f"/api/runs/{run_id}").json()["status"] == "pending"

        card_b.get_by_role("button", name=BUTTON["Approve"]).click()
        expect(card_b.locator(".decided")).to_contain_text("Approved by reviewer2")
        run = wait_run(api, run_id, "done", "failed")
        assert run["status"] == "done", run
        shoot(page_b, "2-second-approval-decides")
    finally:
        admin.delete(f"/api/rules/{rule_id}")
        admin.close()


def test_the_first_approval_updates_the_second_reviewer_s_inbox_row_live(app, api, contexts, shoot):
    """Reviewer B watches the inbox list (no request open): A's approval of a 2-of-2 request
    turns B's row from "0 of 2 approved" to "1 of 2 approved" with no reload."""
    marker = f"rowcount{tag()}"
    token = app.manage("api_token", "admin", "--name", "e2e-rules-row").strip().splitlines()[-1]
    admin = httpx.Client(
        base_url=app.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    made = admin.post(
        "/api/rules",
        json={
            "name": f"two people {marker}",
            "position": 0,
            "tool": "refund",
            "effect": "require_approvers",
            "approvals_needed": 2,
            "condition": f'run.prompt.contains("{marker}")',
        },
    )
    assert made.status_code == 201, made.text
    rule_id = made.json()["id"]
    try:
        page_a = login(contexts(), app, "reviewer")
        page_b = login(contexts(), app, "reviewer2")
        run_id, request_id = halted_run(api, f"Refund order A-1001, $250 ({marker})")
        open_inbox(page_b, app)
        row_b = row_of(page_b, request_id)
        expect(row_b.locator(".approval-progress")).to_have_text("0 of 2 approved")
        page_b.evaluate("window.__sameDocument = true")  # gone if the page reloads

        open_inbox(page_a, app, f"r={request_id}")
        card_of(page_a, request_id).get_by_role("button", name=BUTTON["Approve"]).click()
        expect(page_a.locator("#toasts")).to_contain_text("Your approval counts")

        expect(row_b.locator(".approval-progress")).to_have_text("1 of 2 approved")
        expect(row_b).not_to_have_class(re.compile(r"\bstate-approved\b"))
        assert page_b.evaluate("window.__sameDocument") is True  # live, not a reload
        expect(page_b).to_have_url(app.url("/"))  # B never opened the request
        shoot(page_b, "1-first-approval-in-the-row")
        assert api.get(f"/api/runs/{run_id}").json()["status"] == "pending"
    finally:
        admin.delete(f"/api/rules/{rule_id}")
        admin.close()
