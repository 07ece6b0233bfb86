"""A team run in a real browser: the demo team's coordinator delegates a refund to its refunds
agent, whose relayed call arrives in the inbox with its chain ("coordinator › refunds"); a
reviewer declines it there with a reason, and the run page shows the run finish: the refunds
agent read the reason and recovered, the coordinator reported its text, and the tree of
agents shows both, done."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from .conftest import WAIT
from .test_inbox import BUTTON, card_of, login, open_inbox, row_of, tag, wait_run

pytestmark = pytest.mark.e2e


def _halted_team_run(api: httpx.Client, prompt: str) -> tuple[int, str]:
    response = api.post("/api/runs", json={"agent": "demo-team", "prompt": prompt})
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    run = wait_run(api, run_id, "pending")
    return run_id, run["pending"]["request"]["id"]


def test_a_sub_agents_request_is_decided_in_the_inbox_and_the_team_run_finishes(
    app, api, contexts, shoot
):
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app)
    order = f"T-{int(tag(), 16) % 100000}"
    run_id, request_id = _halted_team_run(api, f"Plan a refund for order {order}, $40")

    row = row_of(page, request_id)
    expect(row.locator(".chain")).to_have_text(re.compile(r"coordinator\s*›\s*refunds"))
    card = card_of(page, request_id)
    expect(card.locator(".meta .chain")).to_have_text(re.compile(r"coordinator\s*›\s*refunds"))
    expect(card).to_contain_text(order)
    shoot(page, "1-sub-agent-request")

    reason = f"over the refund limit {tag()}"
    card.locator("textarea[name=reason]").fill(reason)
    card.get_by_role("button", name=BUTTON["Decline"]).click()
    expect(row).to_have_count(0, timeout=WAIT * 1000)

    page.goto(app.url(f"/runs/{run_id}/"))
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    final = page.locator("section.final")
    expect(final).to_contain_text("The refunds desk reports:", timeout=WAIT * 1000)
    expect(final).to_contain_text(reason)
    coordinator = page.locator('li.agent-node[data-handle="root/coordinator.1"]')
    refunds = page.locator('li.agent-node[data-handle="root/coordinator.1/refunds.1"]')
    expect(coordinator.locator(":scope > details > summary .status")).to_have_text("done")
    expect(refunds.locator(":scope > details > summary .status")).to_have_text("done")
    # a node's transcript folds open: the refunds agent read the decline
    refunds.locator(":scope > details > summary").click()
    expect(refunds.locator(".decision-note")).to_contain_text("Declined by reviewer")
    expect(refunds.locator(":scope > details")).to_contain_text(
        f"relay declined for refund: {reason}"
    )
    shoot(page, "2-team-run-done")
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "done" and reason in run["text"]
