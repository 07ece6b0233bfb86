"""Rules in a real browser: a rule made on the Rules page approves a run's call inline; the
run page names the rule, and nothing ever waited in the inbox."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .test_inbox import login, start_run, tag, wait_run

pytestmark = pytest.mark.e2e


def test_a_rule_made_on_the_rules_page_approves_a_call_with_no_inbox_row(app, api, contexts):
    marker = f"rulecase{tag()}"  # the rule covers this test's run alone (the app is shared)
    page = login(contexts(), app, "admin")
    page.get_by_role("navigation", name="Approvals").get_by_role("link", name="Rules").click()
    form = page.locator("#new-rule")
    form.get_by_label("Name").fill(f"small refunds {marker}")
    form.get_by_label("Position").fill("0")
    form.get_by_label("Tool").fill("ref*")
    form.get_by_label("Condition").fill("args.amount <= <= 5")  # a typo first
    form.get_by_label("Effect").select_option("approve")
    form.get_by_role("button", name="Create rule").click()
    expect(page.locator("#id_new-condition-error")).to_contain_text("does not compile")
    condition = page.locator("#new-rule").get_by_label("Condition")
    expect(condition).to_have_value("args.amount <= <= 5")  # what was typed is kept
    condition.fill(f'args.amount <= 50 && run.prompt.contains("{marker}")')
    page.locator("#new-rule").get_by_role("button", name="Create rule").click()
    row = page.locator("table.rules tr").filter(has_text=f"small refunds {marker}")
    expect(row).to_have_count(1)
    rule_id = row.get_attribute("data-rule")
    try:
        run_id = start_run(api, f"Refund order A-77, $20 ({marker})")
        run = wait_run(api, run_id, "done", "pending", "failed")
        assert run["status"] == "done", run
        requests = api.get("/api/requests", params={"q": marker, "state": "pending"}).json()
        assert requests["count"] == 0

        page.goto(app.url(f"/runs/{run_id}/"))
        expect(page.locator(".outcome").first).to_contain_text(
            re.compile(rf"Approved by rule {rule_id}, small refunds {marker}, version 1")
        )
        page.goto(app.url("/"))
        expect(page.locator("#request-rows")).not_to_contain_text(marker)

        page.goto(app.url("/rules/"))
        row = page.locator(f"#rule-{rule_id}")
        expect(row.locator(".rule-matches")).to_contain_text("1")
        expect(row.locator(".recent a")).to_contain_text(f"run {run_id}")
    finally:
        page.goto(app.url("/rules/"))
        page.get_by_role("button", name=f"Delete rule {rule_id}").click()
        expect(page.locator(f"#rule-{rule_id}")).to_have_count(0)
