"""'All matching' as a snapshot (approvals/snapshots.py): the ids a list's filters matched
when it was ticked, signed for one viewer and those filters; the bulk decision, on the page
and through the API, takes exactly those. And the counts an htmx triage answer carries, the
next lapse a list is drawn with."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core import signing
from django.utils import timezone

from approvals import selectors, services, snapshots
from approvals.models import ApprovalRequest, RequestHide

from .factories import claim, make_user, post_json, session_client, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

HX = {"HX-Request": "true"}


def pending(run) -> ApprovalRequest:
    return run.requests.get(state="pending")


def fresh(row: ApprovalRequest) -> ApprovalRequest:
    row.refresh_from_db()
    return row


@pytest.fixture
def reviewer():
    return make_user(role="reviewer", username="alice")


@pytest.fixture
def reviewer2():
    return make_user(role="reviewer", username="bob")


@pytest.fixture
def three(reviewer):
    return [
        pending(start_and_halt(user=reviewer, prompt=f"Refund order A-10{n}, ${n}"))
        for n in (1, 2, 3)
    ]


def bulk_fields(html: str) -> dict[str, str]:
    form = html[html.index('<form id="bulk-form"') : html.index("</form>", html.index("bulk-form"))]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
    fields.pop("csrfmiddlewaretoken", None)
    return fields


def take_snapshot(client, fields: dict[str, str]) -> str:
    response = client.post("/requests/bulk/snapshot/", {**fields, "all": "1"}, headers=HX)
    assert response.status_code == 200, response.content[:500]
    found = re.search(r'name="snapshot" value="([^"]+)"', response.content.decode())
    assert found, response.content.decode()
    return found.group(1)


# -- the token -------------------------------------------------------------------------------


def test_a_snapshot_is_read_back_only_by_its_viewer_for_its_filters(reviewer, reviewer2, three):
    query = selectors.InboxQuery(claim="unclaimed")
    taken = snapshots.take(query, user=reviewer)
    assert sorted(taken.ids) == sorted(r.request_id for r in three)
    assert snapshots.read(taken.token, user=reviewer, query=query) == taken.ids
    assert snapshots.read(taken.token, user=reviewer) == taken.ids
    with pytest.raises(snapshots.StaleSnapshot):
        snapshots.read(taken.token, user=reviewer2)  # another reviewer's
    with pytest.raises(snapshots.StaleSnapshot):
        snapshots.read(taken.token, user=reviewer, query=selectors.InboxQuery())  # other filters
    with pytest.raises(snapshots.StaleSnapshot):
        snapshots.read(taken.token[:-2] + "xx", user=reviewer)  # tampered
    forged = signing.dumps({"u": reviewer.pk, "f": "", "i": ["x"]}, salt="another.salt")
    with pytest.raises(snapshots.StaleSnapshot):
        snapshots.read(forged, user=reviewer)


def test_a_snapshot_expires_after_a_day(reviewer, three, monkeypatch):
    taken = snapshots.take(selectors.InboxQuery(), user=reviewer)
    later = timezone.now().timestamp() + snapshots.MAX_AGE.total_seconds() + 5
    monkeypatch.setattr(signing.time, "time", lambda: later)
    with pytest.raises(snapshots.StaleSnapshot):
        snapshots.read(taken.token, user=reviewer)


# -- the page -----------------------------------------------------------------------------------


def test_all_matching_takes_what_it_meant_when_ticked_not_what_re_entered_since(
    reviewer, reviewer2, three
):
    """Under "unclaimed", a request bob claimed is not in the list; "all matching" is ticked
    (the snapshot); bob releases it, so it matches again: the decision leaves it pending."""
    held = three[0]
    claim(held, reviewer2)
    client = session_client(reviewer)
    fields = bulk_fields(client.get("/?claim=unclaimed").content.decode())
    token = take_snapshot(client, fields)
    services.request_release(request_id=held.request_id, user=reviewer2)
    response = client.post(
        "/requests/bulk/",
        {**fields, "all": "1", "snapshot": token, "action": "decline", "reason": "no"},
        headers=HX,
    )
    html = response.content.decode()
    assert "2 of 2 declined." in html, html
    assert fresh(held).state == "pending"
    assert {fresh(r).state for r in three[1:]} == {"declined"}


def test_an_un_hidden_request_is_not_taken_by_a_snapshot_from_before(reviewer, three):
    hidden = three[1]
    services.request_hide(request_id=hidden.request_id, user=reviewer, until=None)
    client = session_client(reviewer)
    fields = bulk_fields(client.get("/").content.decode())
    token = take_snapshot(client, fields)
    services.request_unhide(request_id=hidden.request_id, user=reviewer)
    response = client.post(
        "/requests/bulk/", {**fields, "all": "1", "snapshot": token, "action": "decline"}
    )
    assert response.status_code == 302
    assert fresh(hidden).state == "pending"
    assert {fresh(three[0]).state, fresh(three[2]).state} == {"declined"}


def test_a_snapshot_for_other_filters_or_of_another_reviewer_decides_nothing(
    reviewer, reviewer2, three
):
    client = session_client(reviewer)
    fields = bulk_fields(client.get("/?claim=unclaimed").content.decode())
    token = take_snapshot(client, fields)
    other = session_client(reviewer2)
    for who, posted in ((client, {"claim": "mine"}), (other, {"claim": "unclaimed"})):
        response = who.post(
            "/requests/bulk/",
            {**fields, **posted, "all": "1", "snapshot": token, "action": "decline"},
            headers=HX,
        )
        assert response["X-Toolnexus-Outcome"] == "error"
        assert "choose it again" in response.content.decode()
    assert {fresh(r).state for r in three} == {"pending"}


def test_the_snapshot_view_unticked_empties_and_refuses_a_watcher(reviewer, three):
    client = session_client(reviewer)
    response = client.post("/requests/bulk/snapshot/", {}, headers=HX)
    assert response.status_code == 200
    assert 'name="snapshot"' not in response.content.decode()
    response = client.post("/requests/bulk/snapshot/", {"all": "1", "upto": "x"}, headers=HX)
    assert 'role="alert"' in response.content.decode()
    watcher = session_client(make_user(role="watcher", username="wendy"))
    response = watcher.post("/requests/bulk/snapshot/", {"all": "1", "upto": "1"}, headers=HX)
    assert response.status_code == 403
    assert client.get("/requests/bulk/snapshot/").status_code == 405


# -- the API ------------------------------------------------------------------------------------


def test_api_snapshot_then_bulk_takes_exactly_its_ids(reviewer, reviewer2, three):
    held = three[0]
    claim(held, reviewer2)
    client = session_client(reviewer)
    response = post_json(client, "/api/requests/snapshot", {"claim": "unclaimed"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 2 and held.request_id not in body["ids"]
    services.request_release(request_id=held.request_id, user=reviewer2)
    response = post_json(
        client, "/api/requests/bulk", {"snapshot": body["snapshot"], "action": "decline"}
    )
    assert response.status_code == 200, response.content
    assert sorted(r["id"] for r in response.json()["results"]) == sorted(body["ids"])
    assert fresh(held).state == "pending"


def test_api_bulk_takes_ids_or_a_snapshot_and_refuses_another_reviewers(reviewer, reviewer2, three):
    client = session_client(reviewer)
    token = post_json(client, "/api/requests/snapshot", {}).json()["snapshot"]
    both = post_json(
        client, "/api/requests/bulk", {"ids": ["a"], "snapshot": token, "action": "decline"}
    )
    assert both.status_code == 400
    neither = post_json(client, "/api/requests/bulk", {"action": "decline"})
    assert neither.status_code == 400
    theirs = post_json(
        session_client(reviewer2), "/api/requests/bulk", {"snapshot": token, "action": "decline"}
    )
    assert theirs.status_code == 400 and "snapshot" in theirs.json()["detail"]
    bad = post_json(client, "/api/requests/snapshot", {"claim": "someone"})
    assert bad.status_code == 400
    watcher = session_client(make_user(role="watcher", username="wendy"))
    assert post_json(watcher, "/api/requests/snapshot", {}).status_code == 200  # a read
    refused = post_json(
        watcher,
        "/api/requests/bulk",
        {
            "snapshot": post_json(watcher, "/api/requests/snapshot", {}).json()["snapshot"],
            "action": "decline",
        },
    )
    assert refused.status_code == 403
    assert {fresh(r).state for r in three} == {"pending"}


# -- counts and lapses --------------------------------------------------------------------------


def test_a_snooze_answers_with_every_count_of_the_page_it_came_from(reviewer, three):
    client = session_client(reviewer)
    headers = {**HX, "HX-Current-URL": "http://testserver/?sort=oldest"}
    response = client.post(f"/requests/{three[0].request_id}/ignore/", {}, headers=headers)
    html = response.content.decode()
    assert 'id="request-count" data-count="2" data-pending="2"' in html
    assert '<span id="bulk-all-label" hx-swap-oob="true">all 2 matching</span>' in html
    assert re.search(r"data-chip='hidden=only'\] \.chip-count\">1<", html), html
    assert 'hx-swap-oob="innerHTML:#filter-state-' in html  # the menus' counts
    # from a request's own page (no counts there): none
    headers["HX-Current-URL"] = f"http://testserver/requests/{three[1].request_id}/"
    html = client.post(f"/requests/{three[1].request_id}/ignore/", {}, headers=headers)
    assert 'id="request-count"' not in html.content.decode()


def test_a_list_is_drawn_with_when_it_next_changes_by_itself(reviewer, reviewer2, three, settings):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    client = session_client(reviewer)
    assert "data-lapse-in" not in client.get("/").content.decode()
    RequestHide.objects.create(
        request=three[0], user=reviewer, until=timezone.now() + timedelta(seconds=90)
    )
    lapse = re.search(r'id="request-count"[^>]*data-lapse-in="([\d.]+)"', client.get("/").text)
    assert lapse and 80 < float(lapse.group(1)) <= 90
    claim(three[1], reviewer2, minutes_ago=29)  # lapses in a minute
    html = client.get("/?claim=unclaimed").content.decode()
    lapse = re.search(r'id="request-count"[^>]*data-lapse-in="([\d.]+)"', html)
    assert lapse and 50 < float(lapse.group(1)) <= 60
    row = re.search(rf'id="row-{three[1].pk}" data-lapse-in="([\d.]+)"', client.get("/").text)
    assert row and 50 < float(row.group(1)) <= 60  # the row says when its claim lapses
