"""Triage actions on the inbox: claim / release / take over, snooze / ignore / un-hide, and
bulk decisions. Each view parses, calls one service, and answers like the decision views do:
a fragment with htmx (`approvals/_triage.html`'s partials), post/redirect/get with a flash
message without JavaScript.

`claim_guard` wraps the decision views (approvals/web/urls.py): deciding a request another
reviewer holds an active claim on asks first. With JavaScript the page asks (inbox-keys.js
reads the claim bar) and posts `takeover=1`; without it, or when the page did not know yet,
the answer is a confirmation page (or, with htmx, a card that says so and a fresh claim bar).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime, timedelta, tzinfo
from functools import cache, wraps
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, available_timezones

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from .. import selectors, services, snapshots
from ..domain.exceptions import AlreadyDecided, ClaimedByOther, NotAllowed, ServiceError
from ..models import ApprovalRequest, RequestHide
from ..permissions import can_decide, can_decide_request, hidden_agents, permission_needed
from ..presenters import cards
from . import errors, request_pages, views
from .page_counts import page_counts_html
from .render import confirm_page, next_url, render_page

VIEW_REQUESTS = views.VIEW_REQUESTS
DECIDE = views.DECIDE
MAX_BULK = 500
MAX_SNOOZE_MINUTES = 60 * 24 * 30  # 30 days
SNOOZE_MORNING_HOUR = 9  # "until tomorrow": 09:00 in the reviewer's time zone (else UTC)
MAX_ZONE_CHARS = 64  # the longest IANA name is 32 characters
CLAIM_BAR = "approvals/_triage.html#claim-bar"
BULK_RESULT = "approvals/_triage.html#bulk-result"

errors.PERMISSION_OF_URL.update(
    {
        "requests-bulk": DECIDE,
        "request-claim": DECIDE,
        "request-release": DECIDE,
        "request-claim-bar": VIEW_REQUESTS,
        "request-snooze": VIEW_REQUESTS,
        "request-ignore": VIEW_REQUESTS,
        "request-unhide": VIEW_REQUESTS,
    }
)


def _when(at: datetime | None) -> str:
    return f"{at:%H:%M} UTC" if at else "earlier"


def _inbox_url(request: HttpRequest, request_id: str = "") -> str:
    """Where a form without JavaScript goes back to: `next` if it is ours, else the inbox
    with the posted filters (and the request selected)."""
    if request.POST.get("next"):
        return next_url(request)
    params = selectors.InboxQuery.from_params(request.POST).as_params()
    if request_id:
        params["r"] = request_id
    query = urlencode(params)
    return reverse("approvals:inbox") + (f"?{query}" if query else "")


def _hidden_until(row: ApprovalRequest, user) -> tuple[bool, datetime | None]:
    """Whether `user` snoozed or ignored this request, and until when (None: ignored)."""
    found = list(
        RequestHide.objects.filter(request_id=row.pk, user_id=user.pk).values_list(
            "until", flat=True
        )
    )
    if not found or (found[0] is not None and found[0] <= timezone.now()):
        return False, None
    return True, found[0]


def claim_bar_context(
    request: HttpRequest, row: ApprovalRequest, *, message: str = "", level: str = "info"
) -> dict:
    hidden, until = _hidden_until(row, request.user)
    return {
        "card": cards.request_card(row, can_decide=can_decide_request(request.user, row)),
        "claim_message": message,
        "claim_level": level,
        "hidden": hidden,
        "hidden_until": until,
        "claim_oob": False,
    }


def _claim_bar(
    request: HttpRequest,
    request_id: str,
    message: str,
    level: str,
    *,
    trigger: dict | None = None,
) -> HttpResponse:
    """The answer to a claim bar action: the bar again (htmx) or back to the inbox."""
    if not request.htmx:
        getattr(messages, level)(request, message)
        return redirect(_inbox_url(request, request_id))
    row = request_pages.get_request_or_404(request_id, request.user)
    response = render_page(
        request, CLAIM_BAR, claim_bar_context(request, row, message=message, level=level)
    )
    if level == "success" and trigger and {"toolnexus:hidden", "toolnexus:unhidden"} & set(trigger):
        # Hidden or un-hidden: the list's counts, the title's and the chips' change at once.
        # A claim's or release's counts follow with the live push: written here too, their
        # swap lost what the reviewer had chosen and not sent in the new bar.
        response.write(page_counts_html(request))
    response["X-Toolnexus-Outcome"] = level
    if trigger:
        response["HX-Trigger"] = json.dumps(trigger)
    if trigger and "toolnexus:hidden" in trigger:
        # the request leaves the list and the next one opens, its bar with it: the toast
        # is where the snooze or ignore is confirmed
        toast = {"text": message, "level": level, "role": "status", "about": f"request-{row.pk}"}
        response.write(render_to_string("approvals/_live.html#toast", {"toast": toast}))
    return response


def _act(
    request: HttpRequest,
    request_id: str,
    action: Callable[[], object],
    done: str,
    *,
    trigger: dict | None = None,
) -> HttpResponse:
    try:
        action()
    except ApprovalRequest.DoesNotExist:
        raise Http404("no such request") from None
    except NotAllowed as exc:
        if not request.user.has_perm(DECIDE) and request.resolver_match.url_name in (
            "request-claim",
            "request-release",
        ):
            raise PermissionDenied(permission_needed(DECIDE)) from None
        raise PermissionDenied(str(exc)) from None
    except ClaimedByOther as exc:
        return _claim_bar(
            request,
            request_id,
            f"Claimed by {exc.claimed_by} since {_when(exc.claimed_at)}: "
            "take it over to work on it.",
            "warning",
        )
    except AlreadyDecided as exc:
        return _claim_bar(
            request,
            request_id,
            cards.nothing_changed(exc.state, exc.decided_by),
            "warning",
        )
    except ServiceError as exc:
        return _claim_bar(request, request_id, str(exc), "error")
    return _claim_bar(request, request_id, done, "success", trigger=trigger)


def _decide_view(fn):
    return require_POST(login_required(permission_required(DECIDE, raise_exception=True)(fn)))


def _view_view(fn):
    return require_POST(
        login_required(permission_required(VIEW_REQUESTS, raise_exception=True)(fn))
    )


# -- claims ----------------------------------------------------------------------------------


@require_GET
@login_required
@permission_required(VIEW_REQUESTS, raise_exception=True)
def request_claim_bar(request: HttpRequest, request_id: str) -> HttpResponse:
    """The claim bar alone: the page fetches it again when the request changed live."""
    row = request_pages.get_request_or_404(request_id, request.user)
    return render_page(request, CLAIM_BAR, claim_bar_context(request, row))


@_decide_view
def request_claim(request: HttpRequest, request_id: str) -> HttpResponse:
    takeover = bool(request.POST.get("takeover"))
    return _act(
        request,
        request_id,
        lambda: services.request_claim(request_id=request_id, user=request.user, takeover=takeover),
        "You took this request over." if takeover else "You claimed this request.",
        trigger={"toolnexus:claimed": {"id": request_id}},
    )


@_decide_view
def request_release(request: HttpRequest, request_id: str) -> HttpResponse:
    return _act(
        request,
        request_id,
        lambda: services.request_release(request_id=request_id, user=request.user),
        "You released this request.",
        trigger={"toolnexus:claimed": {"id": request_id}},
    )


# -- snooze, ignore, un-hide -------------------------------------------------------------------


@cache
def _zone_names() -> frozenset[str]:
    """The IANA time zone names this server knows (the system's database, or tzdata's);
    "localtime" is the server's own zone, not a name a browser gives."""
    return frozenset(available_timezones()) - {"localtime"}


def has_zone_database() -> bool:
    """Whether this server can read a browser's time zone at all: the snooze form says so
    (`data-zones`), and only then does app.js name the browser's zone on "until tomorrow"
    (tzdata is no runtime dependency: a host without /usr/share/zoneinfo knows none)."""
    return bool(_zone_names())


def snooze_zone(name: str | None) -> ZoneInfo | None:
    """The time zone the reviewer's browser names (its IANA name, as
    Intl.DateTimeFormat().resolvedOptions().timeZone gives it: "Europe/Paris"), or None
    when it is missing or unknown here: the snooze then reads UTC, never an error."""
    name = (name or "").strip()
    if not name or len(name) > MAX_ZONE_CHARS or name not in _zone_names():
        return None
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError
        return None


def snooze_until(choice: str, minutes: str, now: datetime, zone: tzinfo | None = None) -> datetime:
    """When a snooze ends: "1h", "tomorrow" (09:00 the next day in `zone`, the reviewer's
    time zone; UTC without one) or "minutes"."""
    if choice == "1h":
        return now + timedelta(hours=1)
    if choice == "tomorrow":
        zone = zone or UTC
        day = now.astimezone(zone).date() + timedelta(days=1)
        return datetime(day.year, day.month, day.day, SNOOZE_MORNING_HOUR, tzinfo=zone)
    if choice == "minutes":
        try:
            n = int(minutes.strip())
        except ValueError:
            n = 0
        if not 1 <= n <= MAX_SNOOZE_MINUTES:
            raise ValueError(
                f"Snooze for a whole number of minutes from 1 to {MAX_SNOOZE_MINUTES}."
            )
        return now + timedelta(minutes=n)
    raise ValueError("Choose how long to snooze: 1 hour, until tomorrow, or minutes.")


@_view_view
def request_snooze(request: HttpRequest, request_id: str) -> HttpResponse:
    row = request_pages.get_request_or_404(request_id, request.user)
    choice, minutes = request.POST.get("for", ""), request.POST.get("minutes", "")
    if not choice and minutes.strip():
        choice = "minutes"  # only the minutes were given
    zone = snooze_zone(request.POST.get("tz"))  # the browser's zone (app.js); else UTC
    try:
        until = snooze_until(choice, minutes, timezone.now(), zone)
    except ValueError as exc:
        return _claim_bar(request, row.request_id, str(exc), "error")
    return _act(
        request,
        request_id,
        lambda: services.request_hide(request_id=request_id, user=request.user, until=until),
        f"Snoozed until {_snooze_end(until, zone)}: hidden for you until then "
        "(others still see it).",
        trigger={"toolnexus:hidden": {"id": request_id}},
    )


def _snooze_end(until: datetime, zone: ZoneInfo | None) -> str:
    """When a snooze ends, in the reviewer's zone and in UTC (which the claim bar shows):
    "2026-03-12 09:00 Asia/Tokyo (00:00 UTC)"; without a zone, "2026-03-12 09:00 UTC"."""
    if zone is None:
        return f"{until.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    local = until.astimezone(zone)
    text = f"{local:%Y-%m-%d %H:%M} {zone.key}"
    if local.utcoffset() == timedelta(0):
        return text
    return f"{text} ({until.astimezone(UTC):%H:%M} UTC)"


@_view_view
def request_ignore(request: HttpRequest, request_id: str) -> HttpResponse:
    request_pages.get_request_or_404(request_id, request.user)
    return _act(
        request,
        request_id,
        lambda: services.request_hide(request_id=request_id, user=request.user, until=None),
        "Ignored: hidden for you until you un-hide it (others still see it).",
        trigger={"toolnexus:hidden": {"id": request_id}},
    )


@_view_view
def request_unhide(request: HttpRequest, request_id: str) -> HttpResponse:
    request_pages.get_request_or_404(request_id, request.user)
    return _act(
        request,
        request_id,
        lambda: services.request_unhide(request_id=request_id, user=request.user),
        "Shown again in your inbox.",
        trigger={"toolnexus:unhidden": {"id": request_id}},
    )


# -- bulk decisions ----------------------------------------------------------------------------


STATUS_LABELS = {
    "done": "done",
    "already": "already decided",
    "invalid": "not decided",
    "forbidden": "not allowed",
    "missing": "not found",
}


MAX_PK = 2**63 - 1  # a BigAutoField's largest value
STALE_ALL = (
    "“All matching” came without the list it was chosen on (or from an older page): "
    "reload the inbox and choose it again. Nothing was decided."
)


def _bulk_upto(value: str | None) -> int:
    """The bulk form's `upto` (the newest request pk its list matched when drawn): a whole
    number, else ValueError. The form always carries it; the API takes ids, not filters."""
    value = (value or "").strip()
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_PK:
        raise ValueError(STALE_ALL)
    return int(value)


DRAWN_MAX_AGE = timedelta(days=1)


def _bulk_drawn(value: str | None) -> datetime:
    """The bulk form's `drawn`: the moment its list was drawn. "All matching" takes what the
    filters matched then, so a snooze or a claim that lapsed since does not bring back a
    request the reviewer never saw in it. Absent (a page from before the field): now.
    ValueError: not a time with its zone, later than now, or older than a day."""
    value = (value or "").strip()
    now = timezone.now()
    if not value:
        return now
    try:
        drawn = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(STALE_ALL) from None
    if timezone.is_naive(drawn) or not now - DRAWN_MAX_AGE <= drawn <= now + timedelta(seconds=5):
        raise ValueError(STALE_ALL)
    return min(drawn, now)


def _bulk_ids(request: HttpRequest) -> tuple[list[str], int]:
    """The request ids a bulk decision takes, and how many requests "all matching"'s filters
    match that arrived after its list was drawn (left out: nobody saw them). ValueError:
    "all matching" without a valid `upto` or with an invalid `drawn`."""
    if request.POST.get("all") and request.POST.get("snapshot"):
        # As it stood when ticked (bulk_snapshot.py): exactly those, for these filters.
        query = selectors.InboxQuery.from_params(request.POST)
        return snapshots.read(request.POST["snapshot"], user=request.user, query=query), 0
    if request.POST.get("all"):  # without the snapshot (no JavaScript): as drawn
        upto = _bulk_upto(request.POST.get("upto"))
        drawn = _bulk_drawn(request.POST.get("drawn"))
        query = selectors.InboxQuery.from_params(request.POST)
        reads = {"user_id": request.user.pk, "hidden_agents": hidden_agents(request.user)}
        ids = selectors.request_ids_matching(query, limit=MAX_BULK, upto=upto, now=drawn, **reads)
        newer = selectors.count_matching_after(query, after=upto, cap=MAX_BULK, now=drawn, **reads)
        return ids, newer
    seen: dict[str, None] = {}
    for value in request.POST.getlist("ids"):
        value = value.strip()
        if value:
            seen[value] = None
    return list(seen), 0


def _newer_note(newer: int) -> str:
    if not newer:
        return ""
    n = selectors.count_label(newer, cap=MAX_BULK)
    requests = "request" if newer == 1 else "requests"
    return (
        f" {n} {requests} matching these filters arrived after the list was drawn:"
        " left pending for you to look at first."
    )


def _outcome_lines(request: HttpRequest, outcomes) -> list[dict]:
    """One line per request: what it was (agent, tool, key arguments) and what happened to
    it, saying who decided it first when somebody did (one query for the rows)."""
    rows = {
        row.request_id: row
        for row in selectors.request_list(
            state=None, hidden_agents=hidden_agents(request.user)
        ).filter(request_id__in=[o.request_id for o in outcomes])
    }
    lines = []
    for o in outcomes:
        row = rows.get(o.request_id)
        label, text = o.request_id, o.message
        if row is not None:
            what, summary = cards.row_summary(row)
            label = f"{row.agent} · {what}: {summary}" if summary else f"{row.agent} · {what}"
            if o.status == "already":
                who = row.decided_by.get_username() if row.decided_by else "the system"
                when = f" at {row.decided_at:%H:%M:%S} UTC" if row.decided_at else ""
                text = f"already {row.state} by {who}{when}"
        lines.append(
            {
                "request_id": o.request_id,
                "status": o.status,
                "status_label": STATUS_LABELS.get(o.status, o.status),
                "label": label,
                "text": text,
            }
        )
    return lines


def _bulk_problem(request: HttpRequest, text: str) -> HttpResponse:
    if not request.htmx:
        messages.error(request, text)
        return redirect(_inbox_url(request))
    response = render_page(request, BULK_RESULT, {"bulk_error": text, "outcomes": [], "action": ""})
    response["X-Toolnexus-Outcome"] = "error"
    return response


@_decide_view
def requests_bulk(request: HttpRequest) -> HttpResponse:
    action = request.POST.get("action", "")
    if action not in ("approve", "decline"):
        return _bulk_problem(request, "Choose Approve selected or Decline selected.")
    try:
        ids, newer = _bulk_ids(request)
    except ValueError as exc:
        return _bulk_problem(request, str(exc))
    if not ids and request.POST.get("all"):
        return _bulk_problem(
            request,
            "No request these filters matched when the list was drawn is left to decide."
            f"{_newer_note(newer)} Nothing was decided.",
        )
    if not ids:
        return _bulk_problem(
            request, "Select at least one request (its checkbox, or x on the keyboard)."
        )
    if len(ids) > MAX_BULK:
        return _bulk_problem(
            request, f"At most {MAX_BULK} requests at once: you selected {len(ids)}."
        )
    reason = request.POST.get("reason", "") if action == "decline" else ""
    try:
        outcomes = services.requests_bulk(
            request_ids=ids, user=request.user, action=action, reason=reason
        )
    except NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except ServiceError as exc:
        return _bulk_problem(request, f"Nothing was decided: {exc}")
    done = [o for o in outcomes if o.status == "done"]
    verb = "approved" if action == "approve" else "declined"
    summary = f"{len(done)} of {len(outcomes)} {verb}."
    if request.POST.get("all") and len(ids) >= MAX_BULK:
        summary += f" At most {MAX_BULK} at once: run it again for the rest."
    summary += _newer_note(newer)
    all_done = len(done) == len(outcomes) and not newer
    lines = _outcome_lines(request, outcomes)
    if not request.htmx:
        (messages.success if all_done else messages.warning)(request, summary)
        for line in lines:
            if line["status"] != "done":
                messages.warning(request, f"{line['label']}: {line['text']}")
        return redirect(_inbox_url(request))
    response = render_page(
        request,
        BULK_RESULT,
        {
            "outcomes": lines,
            "summary": summary,
            "action": action,
            "bulk_error": "",
        },
    )
    response["X-Toolnexus-Outcome"] = "success" if all_done else "warning"
    response["HX-Trigger"] = json.dumps(
        {"toolnexus:bulk-done": {"done": [o.request_id for o in done]}}
    )
    return response


# -- taking over on a decision -------------------------------------------------------------------


def claim_guard(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap a decision view: deciding a request someone else holds an active claim on asks
    first (a form posted with `takeover` has asked), then takes the claim over (an audit
    event says so) and decides."""

    @wraps(view)
    def guarded(request: HttpRequest, request_id: str, *args, **kwargs) -> HttpResponse:
        user = request.user
        if request.method != "POST" or not user.is_authenticated or not can_decide(user):
            return view(request, request_id, *args, **kwargs)
        try:
            row = request_pages.get_request_or_404(request_id, user)
        except Http404:
            return view(request, request_id, *args, **kwargs)
        holder = selectors.active_claim(row)
        if (
            holder is None
            or holder.pk == user.pk
            or row.state != ApprovalRequest.State.PENDING
            or not can_decide_request(user, row, approving=False)
        ):
            return view(request, request_id, *args, **kwargs)
        name = holder.get_username()
        if request.POST.get("takeover"):
            # The decision says what is wrong if this fails (decided meanwhile, not allowed).
            with suppress(ServiceError):
                services.request_claim(request_id=request_id, user=user, takeover=True)
            return view(request, request_id, *args, **kwargs)
        text = f"{name} claimed this request at {_when(row.claimed_at)}."
        if request.htmx:
            response = request_pages.decision_outcome(
                request,
                request_id,
                f"{text} Nothing was sent: decide again to take it over.",
                "error",
            )
            context = claim_bar_context(request, row)
            context["claim_oob"] = True
            response.write(render_to_string(CLAIM_BAR, context, request=request))
            return response
        detail = f"{text} Deciding takes it over from them."
        card = cards.request_card(row, can_decide=True)
        request.POST = request.POST.copy()  # the confirmation page posts it all again, and:
        request.POST["takeover"] = "1"
        if card.needs_confirmation and request.resolver_match.url_name == "request-approve":
            detail += " The agent's tool runs as soon as you confirm. It cannot be undone."
        response = confirm_page(
            request,
            title=f"Take over from {name}?",
            detail=detail,
            action=request.path,
            button="Yes, take it over and decide",
        )
        return response

    return guarded
