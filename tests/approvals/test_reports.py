"""The team dashboard (/reports/): its figures against a known data set (exact values, on
SQLite and, with DATABASE_URL, PostgreSQL), who may see it (page, CSV, header link), and the
CSV export's escaping of cells a spreadsheet would run as formulas."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission

from approvals.models import AgentAccess, AgentPolicy, ApprovalRequest, Run
from approvals.presenters import reports as presenter
from approvals.selectors import reports as selectors

from .factories import make_user, session_client

pytestmark = pytest.mark.django_db

# Yesterday noon: fixed figures in the presenter's calls (now=NOW), and still in the last 30
# days for the pages, which read the clock.
NOW = (datetime.now(UTC) - timedelta(days=1)).replace(hour=12, minute=0, second=0, microsecond=0)
DECIDED = NOW - timedelta(days=1)  # every recent decision was made then


def day(days_back: int) -> str:
    return (NOW - timedelta(days=days_back)).date().isoformat()


_seq = iter(range(10_000))


def _request(agent: str, state: str, created_at, *, decided_at=None, by=None, reason=""):
    n = next(_seq)
    run = Run.objects.create(agent=agent, prompt=f"p{n}", status="done")
    row = ApprovalRequest.objects.create(
        run=run,
        agent=agent,
        request_id=f"rep-{n}",
        kind="tool_call",
        state=state,
        decided_at=decided_at,
        decided_by=by,
        reason=reason,
    )
    # created_at is auto_now_add: set the arrival the data set needs afterwards
    ApprovalRequest.objects.filter(pk=row.pk).update(created_at=created_at)
    return row


def _decision(agent, minutes, by, state="approved", reason="", decided=DECIDED):
    return _request(
        agent,
        state,
        decided - timedelta(minutes=minutes),
        decided_at=decided,
        by=by,
        reason=reason,
    )


@pytest.fixture
def data_set():
    """billing: alice decides in 1, 2, 3, 4 (declined, "over limit") and 10 (declined, "over
    limit") minutes, bob in 30, a rule-like decision with no person; support: bob in 5 and 20
    (declined with a formula for a reason). 40 days ago alice declined a billing request after
    60 minutes ("old"). Pending: 10 min, 2 h, 2 h, 30 h and 10 days old; one expired."""
    alice = make_user(username="alice")
    bob = make_user(username="bob")
    for minutes, state, reason in [
        (1, "approved", ""),
        (2, "answered", ""),
        (3, "approved", ""),
        (4, "declined", "over limit"),
        (10, "declined", "over limit"),
    ]:
        _decision("billing", minutes, alice, state, reason)
    _decision("billing", 30, bob)
    _decision("billing", 0, None)  # decided by no person (a rule): no time to decision
    _decision("support", 5, bob)
    _decision("support", 20, bob, "declined", '=HYPERLINK("http://x","click")')
    _decision("billing", 60, alice, "declined", "old", decided=NOW - timedelta(days=40))
    for age in [
        timedelta(minutes=10),
        timedelta(hours=2),
        timedelta(hours=2),
        timedelta(hours=30),
        timedelta(days=10),
    ]:
        _request("support", "pending", NOW - age)
    _request("support", "expired", NOW - timedelta(days=3), decided_at=NOW - timedelta(days=2))
    return alice, bob


def reports_viewer(role="watcher"):
    user = make_user(role=role)
    user.user_permissions.add(Permission.objects.get(codename="view_reports"))
    return type(user).objects.get(pk=user.pk)


def minutes(n):
    return timedelta(minutes=n)


def test_decision_times_are_nearest_rank_medians_and_90th_percentiles(data_set):
    times = selectors.decision_times(since=NOW - timedelta(days=30))
    assert times["agent"] == [
        selectors.DecisionTimes("billing", 6, minutes(3), minutes(30)),
        selectors.DecisionTimes("support", 2, minutes(5), minutes(20)),
    ]
    assert times["reviewer"] == [
        selectors.DecisionTimes("alice", 5, minutes(3), minutes(10)),
        selectors.DecisionTimes("bob", 3, minutes(20), minutes(30)),
    ]
    longer = selectors.decision_times(since=NOW - timedelta(days=90))
    assert longer["agent"][0] == selectors.DecisionTimes("billing", 7, minutes(4), minutes(60))
    assert longer["reviewer"][0] == selectors.DecisionTimes("alice", 6, minutes(3), minutes(60))


def test_the_page_figures_for_30_and_90_days(data_set):
    page = presenter.report_page(days=30, now=NOW)
    sections = {s["id"]: s for s in page["sections"]}
    assert page["summary"] == {
        "decisions": 9,
        "declines": 3,
        "decline_rate": 33.3,
        "waiting": 5,
    }
    per_day = sections["per-day"]["rows"]
    assert per_day[0][0] == day(30) and per_day[-1][0] == day(0)
    assert len(per_day) == 31
    assert [row for row in per_day if row[1]] == [
        [day(10), 1, 0],
        [day(3), 1, 0],
        [day(1), 10, 3],
        [day(0), 3, 0],
    ]
    assert sections["times-agent"]["rows"] == [
        ["billing", 6, "3 min", "30 min"],
        ["support", 2, "5 min", "20 min"],
    ]
    assert sections["times-reviewer"]["rows"] == [
        ["alice", 5, "3 min", "10 min"],
        ["bob", 3, "20 min", "30 min"],
    ]
    assert sections["times-agent"]["chart"]["datasets"] == [
        {"label": "median", "data": [3.0, 5.0]},
        {"label": "90th percentile", "data": [30.0, 20.0]},
    ]
    assert sections["decline-rate"]["rows"] == [
        ["billing", 7, 2, 28.6],
        ["support", 2, 1, 50.0],
    ]
    assert sections["decline-reasons"]["rows"] == [
        ["over limit", 2],
        ['=HYPERLINK("http://x","click")', 1],
    ]
    assert sections["waiting"]["rows"] == [
        ["under 1 hour", 1],
        ["1 to 4 hours", 2],
        ["4 to 24 hours", 0],
        ["1 to 7 days", 1],
        ["over 7 days", 1],
    ]
    assert len(page["charts"]) == 6

    longer = {s["id"]: s for s in presenter.report_page(days=90, now=NOW)["sections"]}
    assert longer["times-agent"]["rows"][0] == ["billing", 7, "4 min", "1 h"]
    assert longer["decline-reasons"]["rows"] == [
        ["over limit", 2],
        ['=HYPERLINK("http://x","click")', 1],
        ["old", 1],
    ]
    assert len(longer["per-day"]["rows"]) == 91


def test_an_agent_the_viewer_may_not_see_is_left_out_of_every_figure(data_set):
    from django.contrib.auth.models import Group

    policy = AgentPolicy.objects.create(agent="support")
    AgentAccess.objects.create(policy=policy, group=Group.objects.create(name="support team"))
    client = session_client(reports_viewer())
    page = client.get("/reports/").context["report"]
    sections = {s["id"]: s for s in page["sections"]}
    assert [r[0] for r in sections["times-agent"]["rows"]] == ["billing"]
    assert [r[0] for r in sections["decline-rate"]["rows"]] == ["billing"]
    assert page["summary"]["waiting"] == 0


def test_an_empty_database_gives_zeros_and_no_error():
    page = presenter.report_page(days=7, now=NOW)
    assert page["summary"] == {"decisions": 0, "declines": 0, "decline_rate": 0.0, "waiting": 0}
    assert len(page["sections"][0]["rows"]) == 8  # 7 days back and today, each 0
    assert page["charts"][-1]["id"] == "chart-waiting"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("=1+1", "'=1+1"),
        ("+SUM(A1)", "'+SUM(A1)"),
        ("-2+3", "'-2+3"),
        ("@cmd", "'@cmd"),
        ("\t=1", "'\t=1"),
        ("over limit", "over limit"),
        ("a=b", "a=b"),
        (12, 12),
        (28.6, 28.6),
    ],
)
def test_csv_cells_that_start_like_a_formula_are_escaped(value, written):
    assert presenter.csv_cell(value) == written


def test_the_csv_export_holds_every_table_and_escapes_the_reasons(data_set):
    client = session_client(reports_viewer())
    response = client.get("/reports/export.csv?days=30")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert 'filename="toolnexus-reports-30d-' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert ["Most common decline reasons", "last 30 days"] in rows
    assert ['\'=HYPERLINK("http://x","click")', "1"] in rows
    assert not any(cell.startswith(("=", "+", "-", "@")) for row in rows for cell in row)
    assert ["reviewer", "decisions", "median", "90th percentile"] in rows
    assert ["bob", "3", "20 min", "30 min"] in rows


def test_a_period_not_offered_is_a_clear_400():
    client = session_client(reports_viewer())
    page = client.get("/reports/?days=13")
    assert page.status_code == 400
    assert "days: 13 is not offered; choose 7, 30, 90" in page.content.decode()
    assert page.context["report"]["days"] == 30  # the default period is still shown
    export = client.get("/reports/export.csv?days=x")
    assert export.status_code == 400
    assert "days: 'x' is not a number" in export.content.decode()


def test_a_reports_viewer_sees_the_link_the_page_and_its_charts_data(data_set):
    client = session_client(reports_viewer())
    assert 'href="/reports/"' in client.get("/runs/").content.decode()
    page = client.get("/reports/?days=7")
    assert page.status_code == 200
    body = page.content.decode()
    assert '<a href="?days=7" aria-current="page">' in body
    assert 'id="report-charts" type="application/json"' in body
    assert "chart.umd.min.js" in body and "reports.js" in body
    assert "<caption>Time to decision per reviewer, last 7 days</caption>" in body
    assert "=HYPERLINK(&quot;http://x&quot;,&quot;click&quot;)" in body  # escaped as HTML


@pytest.mark.parametrize("role", ["reviewer", "watcher", "nobody"])
def test_without_view_reports_the_page_and_csv_are_403_and_there_is_no_link(role):
    client = session_client(make_user(role=role))
    if role != "nobody":
        assert 'href="/reports/"' not in client.get("/runs/").content.decode()
    page = client.get("/reports/")
    assert page.status_code == 403
    assert "view reports" in page.content.decode().lower() or "permission" in (
        page.content.decode().lower()
    )
    assert client.get("/reports/export.csv").status_code == 403


def test_signed_out_the_page_and_csv_go_to_sign_in():
    client = session_client()
    for path in ("/reports/", "/reports/export.csv"):
        response = client.get(path)
        assert response.status_code == 302 and "login" in response["Location"]


def test_a_superuser_sees_the_reports():
    assert session_client(make_user(role="superuser")).get("/reports/").status_code == 200


def test_a_periods_figures_are_kept_for_the_cache_seconds_then_read_again(settings):
    settings.TOOLNEXUS_REPORTS_CACHE_SECONDS = 60
    client = session_client(reports_viewer())
    assert client.get("/reports/?days=7").context["report"]["summary"]["decisions"] == 0
    _decision("billing", 5, make_user(username="carol"), decided=datetime.now(UTC))
    # the figures read a moment ago are reused: the page says when they were read
    assert client.get("/reports/?days=7").context["report"]["summary"]["decisions"] == 0
    # another period is its own read
    assert client.get("/reports/?days=30").context["report"]["summary"]["decisions"] == 1
    settings.TOOLNEXUS_REPORTS_CACHE_SECONDS = 0
    assert client.get("/reports/?days=7").context["report"]["summary"]["decisions"] == 1


def test_viewers_who_may_see_different_agents_do_not_share_cached_figures(settings):
    from django.contrib.auth.models import Group

    settings.TOOLNEXUS_REPORTS_CACHE_SECONDS = 60
    _decision("support", 5, make_user(username="dave"), decided=datetime.now(UTC))
    everyone = session_client(reports_viewer())
    assert everyone.get("/reports/").context["report"]["summary"]["decisions"] == 1
    policy = AgentPolicy.objects.create(agent="support")
    AgentAccess.objects.create(policy=policy, group=Group.objects.create(name="support team"))
    outsider = session_client(reports_viewer())
    assert outsider.get("/reports/").context["report"]["summary"]["decisions"] == 0
