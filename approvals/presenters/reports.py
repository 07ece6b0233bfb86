"""The team dashboard's figures shaped for its page (a chart's data and the table behind it,
per section) and for its CSV export (cells escaped against spreadsheet formulas)."""

from __future__ import annotations

import hashlib
from datetime import date, datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.utils import timezone

from ..conf import app_settings
from ..selectors import reports

DEFAULT_DAYS = 30


class BadPeriod(ValueError):
    """`days` is not one the period selector offers (a 400 that names the field)."""


def parse_days(raw: str | None) -> int:
    """The period in days from `?days=`: empty is the default, else one of REPORT_PERIODS."""
    if raw in (None, ""):
        return DEFAULT_DAYS
    choices = ", ".join(str(d) for d in reports.REPORT_PERIODS)
    try:
        days = int(raw)
    except ValueError:
        raise BadPeriod(f"days: {raw!r} is not a number; choose {choices}") from None
    if days not in reports.REPORT_PERIODS:
        raise BadPeriod(f"days: {days} is not offered; choose {choices}")
    return days


def duration_text(value: timedelta | None) -> str:
    """ "45 s", "12 min 5 s", "3 h 20 min", "2 d 4 h": two units at most, for a table."""
    if value is None:
        return ""
    seconds = max(0, round(value.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _minutes(value: timedelta) -> float:
    return round(value.total_seconds() / 60, 1)


def _percent(part: int, whole: int) -> float:
    return round(100 * part / whole, 1) if whole else 0.0


def _days(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def _chart(
    chart_id: str,
    kind: str,
    labels: list[str],
    series: list[tuple[str, list[float]]],
    *,
    unit: str,
    horizontal: bool = False,
) -> dict[str, Any]:
    """What reports.js hands Chart.js (colours come from the page's stylesheet there, so a
    chart follows light and dark mode)."""
    return {
        "id": chart_id,
        "type": kind,
        "labels": labels,
        "datasets": [{"label": name, "data": data} for name, data in series],
        "unit": unit,
        "horizontal": horizontal,
    }


def _times_section(
    key: str, title: str, who: str, rows: list[reports.DecisionTimes]
) -> dict[str, Any]:
    return {
        "id": f"times-{key}",
        "title": title,
        "columns": [who, "decisions", "median", "90th percentile"],
        "rows": [[r.key, r.decisions, duration_text(r.median), duration_text(r.p90)] for r in rows],
        "chart": _chart(
            f"chart-times-{key}",
            "bar",
            [r.key for r in rows],
            [
                ("median", [_minutes(r.median) for r in rows]),
                ("90th percentile", [_minutes(r.p90) for r in rows]),
            ],
            unit="minutes",
            horizontal=True,
        ),
        "empty": "No decisions by people in this period.",
    }


def report_page(*, days: int, now: datetime | None = None, hidden_agents=()) -> dict[str, Any]:
    """The dashboard for the last `days` days: the period selector and its sections, each a
    chart and the table behind it (both from the same figures). Without `now`, the figures
    read in the last TOOLNEXUS_REPORTS_CACHE_SECONDS for the same period and the same agents
    hidden are reused (the page says when they were read)."""
    seconds = app_settings.REPORTS_CACHE_SECONDS
    if now is not None or not seconds:
        return _report_page(days=days, now=now or timezone.now(), hidden_agents=hidden_agents)
    hidden = hashlib.sha256("\n".join(sorted(hidden_agents)).encode()).hexdigest()[:16]
    key = f"approvals:reports:{days}:{hidden}"
    page = cache.get(key)
    if page is None:
        page = _report_page(days=days, now=timezone.now(), hidden_agents=hidden_agents)
        cache.set(key, page, seconds)
    return page


def _report_page(*, days: int, now: datetime, hidden_agents) -> dict[str, Any]:
    since = now - timedelta(days=days)
    per_day = {
        day: (arrived, declined)
        for day, arrived, declined in reports.requests_per_day(
            since=since, hidden_agents=hidden_agents
        )
    }
    today = timezone.localdate(now)
    day_list = _days(timezone.localdate(since), today)
    times = reports.decision_times(since=since, hidden_agents=hidden_agents)
    per_agent, reasons = reports.decline_figures(since=since, hidden_agents=hidden_agents)
    waiting = reports.waiting_by_age(now=now, hidden_agents=hidden_agents)
    decisions = sum(d for _a, d, _x in per_agent)
    declines = sum(x for _a, _d, x in per_agent)

    day_rows = [[d.isoformat(), *per_day.get(d, (0, 0))] for d in day_list]
    sections = [
        {
            "id": "per-day",
            "title": "Requests per day",
            "columns": ["day", "arrived", "declined"],
            "rows": day_rows,
            "chart": _chart(
                "chart-per-day",
                "bar",
                [r[0] for r in day_rows],
                [("arrived", [r[1] for r in day_rows]), ("declined", [r[2] for r in day_rows])],
                unit="requests",
            ),
            "empty": "",
        },
        _times_section("agent", "Time to decision per agent", "agent", times["agent"]),
        _times_section("reviewer", "Time to decision per reviewer", "reviewer", times["reviewer"]),
        {
            "id": "decline-rate",
            "title": "Decline rate per agent",
            "columns": ["agent", "decisions", "declines", "decline rate (%)"],
            "rows": [[a, d, x, _percent(x, d)] for a, d, x in per_agent],
            "chart": _chart(
                "chart-decline-rate",
                "bar",
                [a for a, _d, _x in per_agent],
                [("decline rate (%)", [_percent(x, d) for _a, d, x in per_agent])],
                unit="%",
                horizontal=True,
            ),
            "empty": "No decisions in this period.",
        },
        {
            "id": "decline-reasons",
            "title": "Most common decline reasons",
            "columns": ["reason", "declines"],
            "rows": [[reason or "(no reason)", n] for reason, n in reasons],
            "chart": _chart(
                "chart-decline-reasons",
                "bar",
                [reason or "(no reason)" for reason, _n in reasons],
                [("declines", [n for _r, n in reasons])],
                unit="declines",
                horizontal=True,
            ),
            "empty": "No declines in this period.",
        },
        {
            "id": "waiting",
            "title": "Waiting now, by age",
            "columns": ["waiting for", "requests"],
            "rows": [[label, n] for label, n in waiting],
            "chart": _chart(
                "chart-waiting",
                "bar",
                [label for label, _n in waiting],
                [("requests", [n for _l, n in waiting])],
                unit="requests",
            ),
            "empty": "",
        },
    ]
    return {
        "days": days,
        "periods": [{"days": d, "selected": d == days} for d in reports.REPORT_PERIODS],
        "since": since,
        "now": now,
        "summary": {
            "decisions": decisions,
            "declines": declines,
            "decline_rate": _percent(declines, decisions),
            "waiting": sum(n for _l, n in waiting),
        },
        "sections": sections,
        "charts": [s["chart"] for s in sections if s["rows"]],
    }


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A cell a spreadsheet will not run: text that starts like a formula (= + - @, or a tab
    or carriage return before one) gets a leading apostrophe (OWASP's advice). Numbers stay
    numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def report_csv_rows(page: dict[str, Any]) -> list[list[Any]]:
    """Every section's table, one after another: a row naming the section and the period, its
    column names, its rows, then an empty row."""
    out: list[list[Any]] = []
    for section in page["sections"]:
        out.append([section["title"], f"last {page['days']} days"])
        out.append(section["columns"])
        out.extend([csv_cell(cell) for cell in row] for row in section["rows"])
        out.append([])
    return out
