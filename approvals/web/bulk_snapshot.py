""" "All matching", ticked: the server takes the snapshot of the ids it means now
(approvals/snapshots.py) and hands the page its signed token, which the bulk decision
(triage.requests_bulk) then takes exactly; untick: the token goes."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_POST

from .. import selectors, snapshots
from . import errors, triage, views
from .render import render_page

SNAPSHOT = "approvals/_triage.html#bulk-snapshot"

errors.PERMISSION_OF_URL["requests-bulk-snapshot"] = views.DECIDE


@require_POST
@login_required
@permission_required(views.DECIDE, raise_exception=True)
def requests_bulk_snapshot(request: HttpRequest) -> HttpResponse:
    """The bulk form as posted when "all matching" changed: its filters, `upto` and `drawn`
    (triage._bulk_ids reads them the same way). Unticked: an empty snapshot."""
    context: dict = {"snapshot_answer": True}
    if request.POST.get("all"):
        try:
            upto = triage._bulk_upto(request.POST.get("upto"))
            drawn = triage._bulk_drawn(request.POST.get("drawn"))
        except ValueError as exc:
            context["snapshot_error"] = str(exc)
        else:
            query = selectors.InboxQuery.from_params(request.POST)
            context["snapshot"] = snapshots.take(query, user=request.user, upto=upto, now=drawn)
    return render_page(request, SNAPSHOT, context)
