"""Triage actions through Django's test client (no browser): claims, take-over on a decision,
snooze / ignore / un-hide and bulk decisions, each without JavaScript (post/redirect/get
with a flash message) and with htmx (a fragment); permissions and bad input."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from unittest.mock import ANY
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from approvals import services
from approvals.models import ApprovalRequest, Event, RequestHide
from approvals.presenters.pages import bulk_all_label
from approvals.web import triage
from approvals.web.triage import MAX_BULK, snooze_until, snooze_zone

from .factories import make_request, make_user, session_client, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

HX = {"HX-Request": "true"}


def pending(run) -> ApprovalRequest:
    return run.requests.get(state="pending")


def fresh(row: ApprovalRequest) -> ApprovalRequest:
    row.refresh_from_db()
    return row


def url(row: ApprovalRequest, action: str) -> str:
    return f"/requests/{row.request_id}/{action}/"


def flashes(client, response) -> str:
    """The page a redirect leads to, as text (its flash messages included)."""
    assert response.status_code == 302, response.content[:500]
    return client.get(response["Location"]).content.decode()


@pytest.fixture
def reviewer():
    return make_user(role="reviewer", username="alice")


@pytest.fixture
def reviewer2():
    return make_user(role="reviewer", username="bob")


@pytest.fixture
def row(reviewer):
    return pending(start_and_halt(user=reviewer, prompt="Refund order A-1001, $250"))


# -- claims --------------------------------------------------------------------------------


def test_claim_without_javascript_redirects_with_a_message_and_records_it(reviewer, row):
    client = session_client(reviewer)
    response = client.post(url(row, "claim"))
    assert response["Location"].startswith("/?")
    assert f"r={row.request_id}" in response["Location"]
    assert "You claimed this request." in flashes(client, response)
    assert fresh(row).claimed_by == reviewer
    assert Event.objects.filter(request=row, action="claimed", actor=reviewer).count() == 1


def test_claim_with_htmx_answers_the_claim_bar(reviewer, row):
    response = session_client(reviewer).post(url(row, "claim"), headers=HX)
    html = response.content.decode()
    assert response.status_code == 200
    assert f'id="claim-bar-{row.pk}"' in html
    assert "Claimed by you" in html and "Release" in html
    assert 'data-claimed-by="alice"' in html
    assert "toolnexus:claimed" in response["HX-Trigger"]


def test_another_reviewer_sees_the_claim_and_must_take_it_over(reviewer, reviewer2, row):
    services.request_claim(request_id=row.request_id, user=reviewer)
    client = session_client(reviewer2)
    bar = client.get(url(row, "claim-bar")).content.decode()
    assert "claimed by alice" in bar and "Take over" in bar
    assert 'data-claimed-by="alice"' in bar and 'data-viewer="bob"' in bar

    response = client.post(url(row, "claim"), headers=HX)
    assert "Claimed by alice since" in response.content.decode()
    assert response["X-Toolnexus-Outcome"] == "warning"
    assert fresh(row).claimed_by == reviewer  # unchanged

    response = client.post(url(row, "claim"), {"takeover": "1"})
    assert "You took this request over." in flashes(client, response)
    assert fresh(row).claimed_by == reviewer2
    assert Event.objects.filter(request=row, action="claim taken over", actor=reviewer2).exists()


def test_release_own_claim_only(reviewer, reviewer2, row):
    services.request_claim(request_id=row.request_id, user=reviewer)
    response = session_client(reviewer2).post(url(row, "release"), headers=HX)
    assert "Claimed by alice" in response.content.decode()
    assert fresh(row).claimed_by == reviewer

    response = session_client(reviewer).post(url(row, "release"), headers=HX)
    html = response.content.decode()
    assert "You released this request." in html and "Unclaimed" in html
    assert fresh(row).claimed_by is None


def test_a_watcher_cannot_claim(row):
    watcher = make_user(role="watcher")
    response = session_client(watcher).post(url(row, "claim"))
    assert response.status_code == 403
    assert "permission" in response.content.decode()
    assert fresh(row).claimed_by is None
    # ... and sees the claim bar without its buttons
    bar = session_client(watcher).get(url(row, "claim-bar")).content.decode()
    assert "Unclaimed" in bar and "Claim" not in bar.replace("claim-bar", "")


def test_claiming_a_decided_request_says_who_decided_it(reviewer, reviewer2, row):
    services.request_decline(request_id=row.request_id, user=reviewer2, reason="no")
    client = session_client(reviewer)
    response = client.post(url(row, "claim"))
    assert "Already declined by bob" in flashes(client, response)
    assert fresh(row).claimed_by is None


def test_claim_of_an_unknown_request_is_404(reviewer):
    assert session_client(reviewer).post("/requests/nope/claim/").status_code == 404


def test_claim_is_post_only(reviewer, row):
    assert session_client(reviewer).get(url(row, "claim")).status_code == 405


# -- deciding a request someone else claimed ------------------------------------------------


def test_deciding_anothers_claim_asks_first_without_javascript(reviewer, reviewer2, row):
    services.request_claim(request_id=row.request_id, user=reviewer)
    client = session_client(reviewer2)
    response = client.post(url(row, "decline"), {"reason": "too much"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "Take over from alice?" in html
    assert 'name="takeover" value="1"' in html and 'name="reason" value="too much"' in html
    assert fresh(row).state == "pending"

    response = client.post(url(row, "decline"), {"reason": "too much", "takeover": "1"})
    assert response.status_code == 302
    row = fresh(row)
    assert row.state == "declined" and row.reason == "too much" and row.decided_by == reviewer2
    assert Event.objects.filter(request=row, action="claim taken over", actor=reviewer2).exists()


def test_deciding_anothers_claim_with_htmx_keeps_the_card_and_refreshes_the_bar(
    reviewer, reviewer2, row
):
    services.request_claim(request_id=row.request_id, user=reviewer)
    response = session_client(reviewer2).post(url(row, "approve"), headers=HX)
    html = response.content.decode()
    assert response["X-Toolnexus-Outcome"] == "error"
    assert "alice claimed this request" in html and "take it over" in html
    assert f'id="claim-bar-{row.pk}" class="claim-bar" hx-swap-oob="true"' in html
    assert fresh(row).state == "pending"


def test_own_claim_and_lapsed_claims_ask_nothing(settings, reviewer, reviewer2, row):
    services.request_claim(request_id=row.request_id, user=reviewer)
    settings.TOOLNEXUS_CLAIM_MINUTES = 5
    ApprovalRequest.objects.filter(pk=row.pk).update(
        claimed_at=timezone.now() - timedelta(minutes=6)
    )
    response = session_client(reviewer2).post(url(row, "decline"), {"reason": "late"})
    assert response.status_code == 302
    assert fresh(row).state == "declined"


def test_own_claim_decides_at_once(reviewer, row):
    services.request_claim(request_id=row.request_id, user=reviewer)
    response = session_client(reviewer).post(url(row, "approve"))
    assert response.status_code == 302
    assert fresh(row).state == "approved"


# -- snooze, ignore, un-hide --------------------------------------------------------------------


def test_snooze_choices():
    now = timezone.now().replace(hour=22, minute=30, second=0, microsecond=0)
    assert snooze_until("1h", "", now) == now + timedelta(hours=1)
    tomorrow = snooze_until("tomorrow", "", now)
    assert (tomorrow.date(), tomorrow.hour, tomorrow.minute) == (
        (now + timedelta(days=1)).date(),
        9,
        0,
    )
    assert snooze_until("minutes", " 90 ", now) == now + timedelta(minutes=90)
    for bad in ("", "0", "-5", "1.5", "abc", "100000"):
        with pytest.raises(ValueError, match="whole number of minutes"):
            snooze_until("minutes", bad, now)
    with pytest.raises(ValueError, match="Choose how long"):
        snooze_until("forever", "", now)


NEW_YORK, TOKYO = ZoneInfo("America/New_York"), ZoneInfo("Asia/Tokyo")


@pytest.mark.parametrize(
    "now, zone, until",
    [
        # 22:30 UTC on March 10: 18:30 in New York (EDT since March 8), 07:30 on the 11th in
        # Tokyo: tomorrow 09:00 is 13:00 UTC on the 11th there, 00:00 UTC on the 12th here
        (datetime(2026, 3, 10, 22, 30, tzinfo=UTC), NEW_YORK, datetime(2026, 3, 11, 13, 0)),
        (datetime(2026, 3, 10, 22, 30, tzinfo=UTC), TOKYO, datetime(2026, 3, 12, 0, 0)),
        (datetime(2026, 3, 10, 22, 30, tzinfo=UTC), None, datetime(2026, 3, 11, 9, 0)),
        # 03:00 UTC on January 15 is still the 14th in New York (EST): tomorrow is the 15th
        (datetime(2026, 1, 15, 3, 0, tzinfo=UTC), NEW_YORK, datetime(2026, 1, 15, 14, 0)),
        (datetime(2026, 1, 15, 3, 0, tzinfo=UTC), TOKYO, datetime(2026, 1, 16, 0, 0)),
    ],
)
def test_snooze_until_tomorrow_is_9_in_the_reviewers_time_zone(now, zone, until):
    end = snooze_until("tomorrow", "", now, zone)
    assert end == until.replace(tzinfo=UTC)
    assert end.astimezone(zone or UTC).hour == 9
    assert snooze_until("1h", "", now, zone) == now + timedelta(hours=1)  # zones do not matter


@pytest.mark.parametrize(
    "name",
    [
        "",
        None,
        "  ",
        "Mars/Olympus",
        "../../etc/passwd",
        "/etc/localtime",
        "localtime",
        "Asia/Tokyo\x00",
        "Europe/" + "x" * 80,
        "asia/tokyo",
    ],
)
def test_an_unknown_or_missing_time_zone_is_none_and_never_an_error(name):
    assert snooze_zone(name) is None


def test_a_known_time_zone_is_read_as_the_browser_names_it():
    assert snooze_zone(" America/New_York ") == NEW_YORK
    assert snooze_zone("UTC").key == "UTC"
    assert snooze_zone("Asia/Calcutta") is not None  # an older name some browsers still give


def _local_mornings(zone) -> set:
    """Tomorrow 09:00 in `zone`, as a set: a test unites the one before its post and the one
    after, in case it runs across a midnight there."""
    day = timezone.now().astimezone(zone).date() + timedelta(days=1)
    return {datetime(day.year, day.month, day.day, 9, tzinfo=zone)}


@pytest.mark.parametrize(
    "posted, zone, said",
    [
        ("Asia/Tokyo", TOKYO, " Asia/Tokyo (00:00 UTC): hidden for you"),
        ("America/New_York", NEW_YORK, " America/New_York ("),
        ("Nowhere/Else", UTC, " 09:00 UTC: hidden for you"),  # unknown: UTC, no error
        ("", UTC, " 09:00 UTC: hidden for you"),  # no JavaScript: UTC
    ],
)
def test_snoozing_until_tomorrow_uses_the_posted_time_zone(reviewer, row, posted, zone, said):
    client = session_client(reviewer)
    before = _local_mornings(zone)
    response = client.post(url(row, "snooze"), {"for": "tomorrow", "tz": posted}, headers=HX)
    after = _local_mornings(zone)
    assert response["X-Toolnexus-Outcome"] == "success"
    assert said in response.content.decode()
    assert RequestHide.objects.get(request=row, user=reviewer).until in before | after


def test_snoozing_without_a_time_zone_field_is_utc(reviewer, row):
    client = session_client(reviewer)
    before = _local_mornings(UTC)
    response = client.post(url(row, "snooze"), {"for": "tomorrow"})
    assert RequestHide.objects.get(request=row).until in before | _local_mornings(UTC)
    assert " 09:00 UTC: hidden for you" in flashes(client, response)


def test_the_snooze_form_carries_a_time_zone_field_for_the_page_to_fill(reviewer, row):
    bar = session_client(reviewer).get(url(row, "claim-bar")).content.decode()
    form = bar[bar.index('class="inline snooze"') : bar.index("</form>", bar.index("snooze"))]
    assert '<input type="hidden" name="tz" value="" data-time-zone>' in form
    # without JavaScript the server reads UTC, and the option says so (app.js names the zone)
    assert '<option value="tomorrow" data-tomorrow>until tomorrow 09:00 UTC</option>' in form


@pytest.mark.parametrize("known", [True, False])
def test_the_snooze_form_says_whether_the_server_reads_a_browsers_zone(
    reviewer, row, monkeypatch, known
):
    """app.js names the browser's zone on "until tomorrow" only where the form says the
    server can use one (`data-zones`): a host without a time zone database reads UTC."""
    names = frozenset({"Asia/Tokyo", "UTC"}) if known else frozenset()
    monkeypatch.setattr(triage, "_zone_names", lambda: names)
    client = session_client(reviewer)
    for html in (
        client.get(url(row, "claim-bar")).content.decode(),  # the claim bar again
        client.get(f"/?r={row.request_id}").content.decode(),  # the page's detail pane
    ):
        start = html.index('class="inline snooze"')
        tag = html[start : html.index(">", start)]
        assert ('data-zones="1"' in tag) is known
    response = client.post(url(row, "snooze"), {"for": "tomorrow", "tz": "Asia/Tokyo"}, headers=HX)
    said = " Asia/Tokyo (00:00 UTC): hidden for you" if known else " 09:00 UTC: hidden for you"
    assert said in response.content.decode()


def test_snooze_hides_for_me_only(reviewer, reviewer2, row):
    client = session_client(reviewer)
    response = client.post(url(row, "snooze"), {"for": "minutes", "minutes": "30"}, headers=HX)
    html = response.content.decode()
    assert "Snoozed until" in html and "others still see it" in html
    assert "Un-hide" in html
    assert "toolnexus:hidden" in response["HX-Trigger"]
    hide = RequestHide.objects.get(request=row)
    assert hide.user == reviewer
    assert timedelta(minutes=29) < hide.until - timezone.now() <= timedelta(minutes=30)
    assert not RequestHide.objects.filter(user=reviewer2).exists()
    assert "Un-hide" not in session_client(reviewer2).get(url(row, "claim-bar")).content.decode()


def test_snooze_with_bad_minutes_says_so_and_hides_nothing(reviewer, row):
    client = session_client(reviewer)
    response = client.post(url(row, "snooze"), {"for": "minutes", "minutes": "soon"})
    assert "whole number of minutes" in flashes(client, response)
    response = client.post(url(row, "snooze"), {"for": "minutes", "minutes": "x"}, headers=HX)
    assert response["X-Toolnexus-Outcome"] == "error"
    assert not RequestHide.objects.exists()


def test_ignore_then_unhide(reviewer, row):
    client = session_client(reviewer)
    response = client.post(url(row, "ignore"))
    assert "Ignored" in flashes(client, response)
    assert RequestHide.objects.get(request=row, user=reviewer).until is None
    bar = client.get(url(row, "claim-bar")).content.decode()
    assert "Ignored by you" in bar and "Un-hide" in bar

    response = client.post(url(row, "unhide"), headers=HX)
    assert "Shown again" in response.content.decode()
    assert not RequestHide.objects.exists()


def test_hiding_needs_the_view_permission(row):
    nobody = make_user(role="nobody")
    assert session_client(nobody).post(url(row, "ignore")).status_code == 403
    assert not RequestHide.objects.exists()


# -- bulk decisions ----------------------------------------------------------------------------


@pytest.fixture
def three(reviewer):
    return [
        pending(start_and_halt(user=reviewer, prompt=f"Refund order A-10{n}, ${n}"))
        for n in (1, 2, 3)
    ]


def test_bulk_approve_without_javascript(reviewer, three):
    client = session_client(reviewer)
    ids = [r.request_id for r in three]
    response = client.post("/requests/bulk/", {"ids": ids, "action": "approve"})
    assert "3 of 3 approved." in flashes(client, response)
    assert {fresh(r).state for r in three} == {"approved"}


def test_bulk_decline_with_one_reason_and_one_already_decided(reviewer, reviewer2, three):
    services.request_approve(request_id=three[1].request_id, user=reviewer2)
    response = session_client(reviewer).post(
        "/requests/bulk/",
        {"ids": [r.request_id for r in three], "action": "decline", "reason": "batch no"},
        headers=HX,
    )
    html = response.content.decode()
    assert "2 of 3 declined." in html
    assert html.count('class="bulk-done"') == 2
    assert 'class="bulk-already"' in html and "already approved by bob" in html
    assert response["X-Toolnexus-Outcome"] == "warning"
    assert "toolnexus:bulk-done" in response["HX-Trigger"]
    states = [(fresh(r).state, r.reason) for r in three]
    assert states == [("declined", "batch no"), ("approved", ""), ("declined", "batch no")]


def test_bulk_approve_leaves_what_needs_an_answer_and_does_the_rest(reviewer, three):
    question = pending(start_and_halt(user=reviewer, prompt="Please ask the customer a question"))
    ids = [three[0].request_id, question.request_id, three[1].request_id]
    response = session_client(reviewer).post(
        "/requests/bulk/", {"ids": ids, "action": "approve"}, headers=HX
    )
    html = response.content.decode()
    assert "2 of 3 approved." in html and 'class="bulk-invalid"' in html
    assert fresh(question).state == "pending"
    assert fresh(three[0]).state == fresh(three[1]).state == "approved"


def bulk_fields(html: str) -> dict[str, str]:
    """The hidden fields of the inbox's bulk form (the list's filters, its cutoff), as the
    page posts them with "all matching"."""
    form = html[html.index('<form id="bulk-form"') : html.index("</form>", html.index("bulk-form"))]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
    fields.pop("csrfmiddlewaretoken", None)
    return fields


def test_bulk_all_matching_uses_the_filters(reviewer, three):
    other = pending(start_and_halt(user=reviewer, prompt="Please ask the customer a question"))
    client = session_client(reviewer)
    response = client.post(
        "/requests/bulk/",
        {
            "all": "1",
            "kind": "tool_call",
            "upto": str(other.pk),
            "action": "decline",
            "reason": "all of them",
        },
    )
    assert response["Location"] == "/?kind=tool_call"
    assert "3 of 3 declined." in flashes(client, response)
    assert {fresh(r).state for r in three} == {"declined"}
    assert fresh(other).state == "pending"


@pytest.mark.parametrize("action", ["approve", "decline"])
def test_all_matching_decides_only_the_requests_the_list_had_when_drawn(reviewer, three, action):
    """A request that arrives after the reviewer chose "all matching" is not decided with
    them (its tool would run on approve): the form carries the newest request the list
    matched when drawn; the newer one stays pending and the result says so."""
    client = session_client(reviewer)
    fields = bulk_fields(client.get("/?kind=tool_call").content.decode())
    assert fields == {"kind": "tool_call", "upto": str(three[-1].pk), "drawn": ANY}
    later = pending(start_and_halt(user=reviewer, prompt="Refund order A-2001, $9"))
    response = client.post(
        "/requests/bulk/", {**fields, "all": "1", "action": action, "reason": "no"}, headers=HX
    )
    html = response.content.decode()
    verb = f"{action}d"
    assert f"3 of 3 {verb}." in html
    assert "1 request matching these filters arrived after the list was drawn" in html
    assert later.request_id not in html  # not among the outcomes: it was never taken
    assert response["X-Toolnexus-Outcome"] == "warning"  # a request is left to look at
    assert {fresh(r).state for r in three} == {"approved" if action == "approve" else verb}
    assert fresh(later).state == "pending"
    # without JavaScript: the same, in the flash messages
    fields = bulk_fields(client.get("/?kind=tool_call").content.decode())
    assert fields["upto"] == str(later.pk)
    newest = pending(start_and_halt(user=reviewer, prompt="Refund order A-2002, $9"))
    response = client.post("/requests/bulk/", {**fields, "all": "1", "action": "decline"})
    page = flashes(client, response)
    assert "1 of 1 declined." in page and "arrived after the list was drawn" in page
    assert fresh(later).state == "declined" and fresh(newest).state == "pending"


def test_an_empty_list_posts_a_cutoff_of_0_and_all_matching_then_decides_nothing(reviewer):
    client = session_client(reviewer)
    fields = bulk_fields(client.get("/").content.decode())
    assert fields == {"upto": "0", "drawn": ANY}
    row = make_request()
    response = client.post(
        "/requests/bulk/", {**fields, "all": "1", "action": "decline"}, headers=HX
    )
    html = response.content.decode()
    assert response["X-Toolnexus-Outcome"] == "error"
    assert "Nothing was decided" in html and "1 request matching these filters arrived" in html
    assert fresh(row).state == "pending"


@pytest.mark.parametrize("upto", [None, "", " ", "abc", "-1", "1.5", "0x10", "9" * 25])
def test_all_matching_without_a_valid_cutoff_decides_nothing(reviewer, three, upto):
    data = {"all": "1", "action": "decline"}
    if upto is not None:
        data["upto"] = upto
    client = session_client(reviewer)
    response = client.post("/requests/bulk/", data, headers=HX)
    assert response["X-Toolnexus-Outcome"] == "error"
    html = response.content.decode()
    assert "Nothing was decided" in html and "reload" in html
    assert "Nothing was decided" in flashes(client, client.post("/requests/bulk/", data))
    assert {fresh(r).state for r in three} == {"pending"}


def test_all_matching_applies_the_filters_as_at_the_moment_the_list_was_drawn(
    reviewer, three, monkeypatch
):
    """A request the reviewer had snoozed when the list was drawn, whose snooze lapses
    before they send "all matching", matches the filters again: it is left out (they never
    saw it in that list), the filters applied as at the moment the form carries (`drawn`)."""
    snoozed = three[0]
    services.request_hide(
        request_id=snoozed.request_id, user=reviewer, until=timezone.now() + timedelta(minutes=5)
    )
    client = session_client(reviewer)
    fields = bulk_fields(client.get("/?kind=tool_call").content.decode())
    drawn = datetime.fromisoformat(fields["drawn"])
    assert timezone.is_aware(drawn) and abs(timezone.now() - drawn) < timedelta(minutes=1)
    later = timezone.now() + timedelta(minutes=10)  # the snooze has lapsed by then
    monkeypatch.setattr(timezone, "now", lambda: later)
    response = client.post(
        "/requests/bulk/", {**fields, "all": "1", "action": "decline"}, headers=HX
    )
    assert "2 of 2 declined." in response.content.decode()
    assert fresh(snoozed).state == "pending"
    assert {fresh(r).state for r in three[1:]} == {"declined"}
    # without the moment (a page from before the field): the filters as they stand now
    fields.pop("drawn")
    response = client.post(
        "/requests/bulk/", {**fields, "all": "1", "action": "decline"}, headers=HX
    )
    assert "1 of 1 declined." in response.content.decode()
    assert fresh(snoozed).state == "declined"


@pytest.mark.parametrize(
    "drawn",
    ["yesterday", "2026-12-01T10:00:00", "later", "earlier"],  # not a time; no zone; range
)
def test_all_matching_with_an_invalid_moment_decides_nothing(reviewer, three, drawn):
    now = timezone.now()
    drawn = {
        "later": (now + timedelta(minutes=5)).isoformat(),
        "earlier": (now - timedelta(days=2)).isoformat(),
    }.get(drawn, drawn)
    data = {"all": "1", "action": "decline", "upto": str(three[-1].pk), "drawn": drawn}
    response = session_client(reviewer).post("/requests/bulk/", data, headers=HX)
    assert response["X-Toolnexus-Outcome"] == "error"
    assert "Nothing was decided" in response.content.decode()
    assert {fresh(r).state for r in three} == {"pending"}


def test_the_bulk_bars_all_matching_reads_the_capped_count_and_what_one_decision_handles(
    reviewer, settings
):
    for _ in range(3):
        make_request()
    client = session_client(reviewer)
    html = client.get("/").content.decode()
    assert '<span id="bulk-all-label">all 3 matching</span>' in html
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 2
    html = client.get("/").content.decode()
    assert '<span id="bulk-all-label">all 2+ matching (at most 500)</span>' in html  # not "all 3"
    assert "all 3 matching" not in html


@pytest.mark.parametrize(
    ("count", "label"),
    [
        (0, "all 0 matching"),
        (500, "all 500 matching"),
        (501, "all 501 matching (the first 500)"),
        (1001, "all 1000+ matching (the first 500)"),  # past the default cap of 1000
    ],
)
def test_the_all_matching_label_names_the_bulk_limit(count, label):
    assert bulk_all_label(count) == label


def test_the_all_matching_label_and_the_bulk_view_share_one_limit():
    assert MAX_BULK == services.MAX_BULK_IDS


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"action": "approve"}, "Select at least one request"),
        ({"ids": ["x"], "action": "explode"}, "Choose Approve selected or Decline selected"),
        ({"ids": [f"id{n}" for n in range(501)], "action": "approve"}, "At most 500"),
    ],
)
def test_bulk_bad_input_says_what_is_wrong(reviewer, three, data, says):
    client = session_client(reviewer)
    assert says in flashes(client, client.post("/requests/bulk/", data))
    response = client.post("/requests/bulk/", data, headers=HX)
    assert says in response.content.decode() and response["X-Toolnexus-Outcome"] == "error"
    assert {fresh(r).state for r in three} == {"pending"}


def test_bulk_reason_too_long_decides_nothing(reviewer, three):
    client = session_client(reviewer)
    response = client.post(
        "/requests/bulk/",
        {"ids": [r.request_id for r in three], "action": "decline", "reason": "x" * 5000},
        headers=HX,
    )
    html = response.content.decode()
    assert "0 of 3 declined." in html or "Nothing was decided" in html
    assert {fresh(r).state for r in three} == {"pending"}


def test_bulk_needs_the_decide_permission(three):
    watcher = make_user(role="watcher")
    response = session_client(watcher).post(
        "/requests/bulk/", {"ids": [r.request_id for r in three], "action": "approve"}
    )
    assert response.status_code == 403
    assert "permission" in response.content.decode()
    assert {fresh(r).state for r in three} == {"pending"}


def test_bulk_with_an_unknown_id_reports_it(reviewer, three):
    response = session_client(reviewer).post(
        "/requests/bulk/", {"ids": ["nope", three[0].request_id], "action": "approve"}, headers=HX
    )
    html = response.content.decode()
    assert 'class="bulk-missing"' in html and "1 of 2 approved." in html


def test_bulk_approve_leaves_what_cannot_be_undone_to_its_card(reviewer, three):
    delete = pending(
        start_and_halt(user=reviewer, prompt="Please delete the account of this customer")
    )
    assert delete.kind == "approval"
    ids = [three[0].request_id, delete.request_id]
    response = session_client(reviewer).post(
        "/requests/bulk/", {"ids": ids, "action": "approve"}, headers=HX
    )
    html = response.content.decode()
    assert "1 of 2 approved." in html and "cannot be undone" in html
    assert fresh(delete).state == "pending" and fresh(three[0]).state == "approved"


def test_bulk_decline_of_what_cannot_be_undone_asks_nothing(reviewer):
    delete = pending(
        start_and_halt(user=reviewer, prompt="Please delete the account of this customer")
    )
    client = session_client(reviewer)
    response = client.post("/requests/bulk/", {"ids": [delete.request_id], "action": "decline"})
    assert "1 of 1 declined." in flashes(client, response)
