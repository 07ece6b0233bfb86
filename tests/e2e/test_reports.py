"""The team dashboard in a real browser, light and dark: Chart.js (shipped with the app) draws
every chart under the page's CSP, in the colours of the scheme in force, each chart followed
by its table; on a phone nothing runs off the side. Screenshots of each."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .test_inbox import halted_run, login, wait_run

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_dashboard_draws_its_charts_in_light_and_dark(app, api, contexts, shoot, scheme):
    # one reason for both schemes: the figures a period read are kept for a minute
    # (TOOLNEXUS_REPORTS_CACHE_SECONDS), so the second scheme may see the first one's page
    reason = "over budget (e2e)"
    run_id, request_id = halted_run(api, "Refund order A-55, $900")
    declined = api.post(f"/api/requests/{request_id}/decline", json={"reason": reason})
    assert declined.status_code == 200, declined.text
    wait_run(api, run_id, "done", "failed", "pending")

    errors: list[str] = []
    page = login(contexts(color_scheme=scheme), app, "admin")
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.get_by_role("navigation", name="Approvals").get_by_role("link", name="Reports").click()
    expect(page).to_have_url(app.url("/reports/"))
    expect(page.locator("#reports")).to_have_attribute("data-charts-drawn", "6")
    # the table behind the chart, for screen readers: one row per bar, in the chart's order
    # (this test's reason among them when it is among the ten most common: the session's other
    # tests decline with reasons of their own, so it may not be)
    reasons = page.locator("#decline-reasons table tbody th")
    expect(reasons.first).to_be_visible()
    labels = page.evaluate("() => Chart.getChart('chart-decline-reasons').data.labels")
    assert labels and [" ".join(t.split()) for t in reasons.all_inner_texts()] == [
        " ".join(label.split()) for label in labels
    ]
    # each chart is drawn in the scheme's text colour (the stylesheet's --fg), readable on
    # its background
    colours = page.evaluate(
        """() => ({
            fg: getComputedStyle(document.documentElement).getPropertyValue('--fg').trim(),
            tick: Chart.getChart('chart-per-day').options.scales.x.ticks.color,
            card: getComputedStyle(document.querySelector('section.report')).backgroundColor,
        })"""
    )
    assert colours["tick"] == colours["fg"]
    assert colours["fg"] == ("#e4e8ee" if scheme == "dark" else "#1c2330")
    assert colours["card"] == ("rgb(23, 29, 38)" if scheme == "dark" else "rgb(255, 255, 255)")
    shoot(page, f"{scheme}-desktop")

    page.get_by_role("link", name="Last 7 days").click()
    expect(page).to_have_url(app.url("/reports/?days=7"))
    expect(page.locator("#reports")).to_have_attribute("data-charts-drawn", "6")

    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    expect(page.locator("#reports")).to_have_attribute("data-charts-drawn", "6")
    overflow = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page runs {overflow}px off a phone's screen"
    shoot(page, f"{scheme}-phone")
    assert not [e for e in errors if "Content Security Policy" in e or "Chart" in e], errors

    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    assert download.value.suggested_filename.startswith("toolnexus-reports-7d-")
