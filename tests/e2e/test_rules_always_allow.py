""" "Always allow" in a real browser: ticked beside Approve on the card, the approval makes a
rule, and the next identical call passes with no request waiting."""

from __future__ import annotations

import re
import secrets

import pytest
from playwright.sync_api import expect

from .test_inbox import card_of, halted_run, login, start_run, wait_run

pytestmark = pytest.mark.e2e


def test_always_allow_with_these_arguments_lets_the_next_identical_call_pass(app, api, contexts):
    order = f"Z-{secrets.randbelow(10**8)}"  # these arguments are this test's alone
    prompt = f"Refund order {order}, $20"
    run_id, request_id = halted_run(api, prompt)
    page = login(contexts(), app, "admin")
    page.goto(app.url(f"/requests/{request_id}/"))
    card = card_of(page, request_id)
    card.get_by_label(re.compile(r"Always allow refund for demo")).check()
    card.get_by_label("Always allow it").select_option("args")
    card.get_by_role("button", name=re.compile(r"^Approve")).first.click()
    assert wait_run(api, run_id, "done", "failed")["status"] == "done"

    page.goto(app.url("/rules/"))
    row = page.locator("table.rules tr").filter(has_text=f"request {request_id}")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("by admin")
    expect(row).to_contain_text(order)  # the exact arguments, as the condition
    rule_id = row.get_attribute("data-rule")
    try:
        again = start_run(api, prompt)
        run = wait_run(api, again, "done", "pending", "failed")
        assert run["status"] == "done", run
        pending = api.get("/api/requests", params={"q": order, "state": "pending"}).json()
        assert pending["count"] == 0
        page.goto(app.url(f"/runs/{again}/"))
        expect(page.locator(".outcome").first).to_contain_text(
            re.compile(rf"Approved by rule {rule_id}, Always allow refund")
        )
    finally:
        page.goto(app.url("/rules/"))
        page.get_by_role("button", name=f"Delete rule {rule_id}").click()
        expect(page.locator(f"#rule-{rule_id}")).to_have_count(0)
