"""The team dashboard (/reports/) and its CSV export, for people with the "view reports"
permission (everyone else gets the 403 page). Figures come from `selectors.reports`, shaped
by `presenters.reports`."""

from __future__ import annotations

import csv

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from ..permissions import hidden_agents, perm, permission_needed
from ..presenters import reports as presenter
from .render import render_page

VIEW_REPORTS = perm("view_reports")


def _require_reports(request: HttpRequest) -> None:
    if not request.user.has_perm(VIEW_REPORTS):
        raise PermissionDenied(permission_needed(VIEW_REPORTS))


@require_GET
@login_required
def report_dashboard(request: HttpRequest) -> HttpResponse:
    """The dashboard for the period `?days=` (7, 30 or 90; 30 when absent). Another value
    shows the default period with an error naming the field, status 400."""
    _require_reports(request)
    error, status = "", 200
    try:
        days = presenter.parse_days(request.GET.get("days"))
    except presenter.BadPeriod as exc:
        error, status, days = str(exc), 400, presenter.DEFAULT_DAYS
    page = presenter.report_page(days=days, hidden_agents=hidden_agents(request.user))
    context = {"nav": "reports", "report": page, "error": error}
    return render_page(request, "approvals/reports.html", context, status=status)


@require_GET
@login_required
def report_csv(request: HttpRequest) -> HttpResponse:
    """Every table of the dashboard for `?days=` as one CSV file (400 for a period not
    offered)."""
    _require_reports(request)
    try:
        days = presenter.parse_days(request.GET.get("days"))
    except presenter.BadPeriod as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    page = presenter.report_page(days=days, hidden_agents=hidden_agents(request.user))
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    stamp = page["now"].strftime("%Y-%m-%d")
    response["Content-Disposition"] = (
        f'attachment; filename="toolnexus-reports-{days}d-{stamp}.csv"'
    )
    csv.writer(response).writerows(presenter.report_csv_rows(page))
    return response
