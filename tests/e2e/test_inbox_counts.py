"""Counts that stay true and "all matching" that is what the reviewer saw (issue 33), in a
real browser: after an ignore the title and the "snoozed / ignored" chip change at once; the
list's count and "all N matching" agree after a live arrival and another reviewer's
decision; a snooze that lapses brings its request back without a reload; a request that
re-enters a filtered list appears in it live, and "all matching" ticked before it came back
does not take it. The app runs in subprocesses (see conftest.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Page, expect

from .test_inbox import halted_run, login, tag
from .test_triage_keys import api2, halted_many, open_triage, row_of, state_of

pytestmark = pytest.mark.e2e

__all__ = ["api2"]  # a fixture, used by name

# Marks the page: a reload would lose the mark.
MARK = "() => { window.__notReloaded = true; }"
NOT_RELOADED = "() => window.__notReloaded === true"


def title_count(page: Page) -> int:
    found = re.match(r"\((\d+)\+?\)", page.title())
    return int(found.group(1)) if found else 0


def chip_count(page: Page, chip: str):
    return page.locator(f'#inbox-chips a[data-chip="{chip}"] .chip-count')


def list_count(page: Page):
    return page.locator("#request-count")


def all_label(page: Page):
    return page.locator("#bulk-all-label")


def test_ignore_changes_the_title_and_the_hidden_chip_at_once(app, api, contexts, shoot):
    t = tag()
    ids = halted_many(api, [f"Refund order C-{n}, ${n} (counts {t})" for n in (1, 2)])
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&sort=oldest&r={ids[0]}")
    page.evaluate(MARK)
    expect(list_count(page)).to_have_text("2 requests pending")
    before_title = title_count(page)
    before_hidden = int(chip_count(page, "hidden=only").inner_text())
    page.locator("#detail .claim-bar").get_by_role("button", name="Ignore").click()
    expect(row_of(page, ids[0])).to_have_count(0)
    expect(list_count(page)).to_have_text("1 request pending")
    expect(all_label(page)).to_have_text("all 1 matching")
    expect(chip_count(page, "hidden=only")).to_have_text(str(before_hidden + 1))
    expect(page).to_have_title(re.compile(rf"^\({before_title - 1}\) "))
    assert page.evaluate(NOT_RELOADED)
    shoot(page, "ignored")


def test_the_count_and_all_matching_agree_after_arrivals_and_others_decisions(
    app, api, api2, contexts, shoot
):
    t = tag()
    ids = halted_many(api, [f"Refund order D-{n}, ${n} (agree {t})" for n in (1, 2)])
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}")
    page.evaluate(MARK)
    expect(list_count(page)).to_have_text("2 requests pending")
    expect(all_label(page)).to_have_text("all 2 matching")
    _, late = halted_run(api, f"Refund order D-3, $3 (agree {t})")
    expect(row_of(page, late)).to_be_visible()
    expect(list_count(page)).to_have_text("3 requests pending")
    expect(all_label(page)).to_have_text("all 3 matching")
    response = api2.post(f"/api/requests/{ids[0]}/decline", json={"reason": "no"})
    assert response.status_code == 200, response.text
    expect(row_of(page, ids[0])).to_have_count(0)
    expect(list_count(page)).to_have_text("2 requests pending")
    expect(all_label(page)).to_have_text("all 2 matching")
    # the agent menu's count follows the filtered list too
    expect(page.locator("#inbox-filters select[name=agent] option[value='']")).to_have_text(
        "all (2)"
    )
    assert page.evaluate(NOT_RELOADED)
    shoot(page, "agree")


def test_a_lapsed_snooze_brings_its_request_back_live(app, api, contexts, shoot):
    t = tag()
    ids = halted_many(api, [f"Refund order L-{n}, ${n} (lapse {t})" for n in (1, 2)])
    until = datetime.now(UTC) + timedelta(seconds=4)
    response = api.post(f"/api/requests/{ids[0]}/snooze", json={"until": until.isoformat()})
    assert response.status_code == 200, response.text
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}")
    page.evaluate(MARK)
    expect(row_of(page, ids[0])).to_have_count(0)
    expect(list_count(page)).to_have_text("1 request pending")
    shoot(page, "1-snoozed")
    expect(row_of(page, ids[0])).to_be_visible(timeout=12_000)  # ~4 s, no reload
    expect(list_count(page)).to_have_text("2 requests pending")
    expect(all_label(page)).to_have_text("all 2 matching")
    assert page.evaluate(NOT_RELOADED)
    shoot(page, "2-back")


def test_all_matching_is_the_set_seen_and_a_returning_request_appears_live(
    app, api, api2, contexts, shoot
):
    """reviewer lists the unclaimed requests of a search; reviewer2 holds one of them. With
    "all matching" ticked and a reason typed, reviewer2 releases it: it appears in the list
    (drawn again, the reason and the choice kept), and the bulk decline leaves it pending."""
    t = tag()
    ids = halted_many(api, [f"Refund order U-{n}, ${n} (unclaimed {t})" for n in (1, 2, 3)])
    held = ids[0]
    assert api2.post(f"/api/requests/{held}/claim", json={}).status_code == 200
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&claim=unclaimed")
    page.evaluate(MARK)
    expect(row_of(page, held)).to_have_count(0)
    expect(list_count(page)).to_have_text("2 requests pending")
    page.locator("#bulk-all").check()
    expect(page.locator("#bulk-snapshot input[name=snapshot]")).to_have_count(1)
    page.fill("#bulk-reason", f"not these {t}")

    assert api2.post(f"/api/requests/{held}/release").status_code == 200
    expect(row_of(page, held)).to_be_visible()  # it entered the list: drawn again, live
    expect(list_count(page)).to_have_text("3 requests pending")
    expect(page.locator("#bulk-reason")).to_have_value(f"not these {t}")
    expect(page.locator("#bulk-all")).to_be_checked()
    expect(page.locator("#bulk-snapshot input[name=snapshot]")).to_have_count(1)
    shoot(page, "1-returned")

    page.get_by_role("button", name="Decline selected").click()
    result = page.locator("#bulk-result")
    expect(result).to_contain_text("2 of 2 declined.")
    assert sorted(
        result.locator(".bulk-results li").evaluate_all("els => els.map(e => e.dataset.requestId)")
    ) == sorted(ids[1:])
    assert state_of(api, held)["state"] == "pending"
    assert {state_of(api, i)["state"] for i in ids[1:]} == {"declined"}
    assert page.evaluate(NOT_RELOADED)
    shoot(page, "2-declined")


# Moves a claim's start back so that it lapses a few seconds from now (claims last
# TOOLNEXUS_CLAIM_MINUTES, 30 by default): a test cannot wait half an hour.
LAPSE_SOON = """
from datetime import timedelta
from django.conf import settings
from django.utils import timezone
from approvals.models import ApprovalRequest
soon = timezone.now() - timedelta(minutes=settings.TOOLNEXUS_CLAIM_MINUTES) + timedelta(seconds=5)
print(ApprovalRequest.objects.filter(request_id={rid!r}).update(claimed_at=soon))
"""


def test_a_lapsed_claim_brings_its_request_back_to_unclaimed_live(app, api, api2, contexts, shoot):
    t = tag()
    ids = halted_many(api, [f"Refund order K-{n}, ${n} (claim lapse {t})" for n in (1, 2)])
    held = ids[0]
    assert api2.post(f"/api/requests/{held}/claim", json={}).status_code == 200
    moved = app.manage("shell", "--no-imports", "-c", LAPSE_SOON.format(rid=held))
    assert moved.strip().splitlines()[-1] == "1"
    page = login(contexts(), app, "reviewer")
    open_triage(page, app, f"q={t}&claim=unclaimed")
    page.evaluate(MARK)
    expect(row_of(page, held)).to_have_count(0)  # reviewer2 holds it
    expect(list_count(page)).to_have_text("1 request pending")
    shoot(page, "1-claimed")
    expect(row_of(page, held)).to_be_visible(timeout=15_000)  # ~5 s, no reload
    expect(list_count(page)).to_have_text("2 requests pending")
    expect(all_label(page)).to_have_text("all 2 matching")
    assert page.evaluate(NOT_RELOADED)
    shoot(page, "2-back")
