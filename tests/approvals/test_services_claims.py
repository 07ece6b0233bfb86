"""approvals.services.claims: per-reviewer snooze / ignore / un-hide, and claims (claim,
release, take-over), audited and announced."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from approvals import events, selectors, services
from approvals.domain.exceptions import AlreadyDecided, ClaimedByOther, InvalidInput, NotAllowed
from approvals.models import AgentAccess, AgentPolicy, ApprovalRequest, Event, RequestHide
from approvals.selectors import InboxQuery

from .factories import claim, counts, inbox, make_request, make_user, start_and_halt

pytestmark = pytest.mark.django_db


# -- hiding: snooze and ignore, per reviewer --------------------------------------------


def test_snooze_and_ignore_hide_only_for_that_reviewer_until_then():
    me, other = make_user(), make_user()
    snoozed, ignored, shown = make_request(), make_request(), make_request()
    until = timezone.now() + timedelta(hours=1)
    services.request_hide(request_id=snoozed.request_id, user=me, until=until)
    services.request_hide(request_id=ignored.request_id, user=me)

    assert inbox(me) == [shown.request_id]
    assert set(inbox(other)) == {snoozed.request_id, ignored.request_id, shown.request_id}
    hidden = {
        r.request_id: r for r in selectors.inbox_requests(InboxQuery(hidden="only"), user_id=me.pk)
    }
    assert set(hidden) == {snoozed.request_id, ignored.request_id}
    assert (
        hidden[snoozed.request_id].viewer_hidden
        and hidden[snoozed.request_id].hidden_until == until
    )
    assert (
        hidden[ignored.request_id].viewer_hidden and hidden[ignored.request_id].hidden_until is None
    )
    assert counts(me)["hidden"] == 2 and counts(other)["hidden"] == 0
    (row,) = selectors.inbox_requests(InboxQuery(), user_id=me.pk)
    assert row.viewer_hidden is False and row.hidden_until is None

    # a snooze that has run out shows the request again; un-hiding shows an ignored one
    RequestHide.objects.filter(request=snoozed).update(until=timezone.now() - timedelta(seconds=1))
    assert set(inbox(me)) == {snoozed.request_id, shown.request_id}
    services.request_unhide(request_id=ignored.request_id, user=me)
    assert set(inbox(me)) == {snoozed.request_id, ignored.request_id, shown.request_id}
    services.request_unhide(request_id=ignored.request_id, user=me)  # nothing hidden: no-op


def test_hiding_again_replaces_the_end_and_bad_ends_are_refused():
    me = make_user()
    row = make_request()
    services.request_hide(request_id=row.request_id, user=me)
    later = timezone.now() + timedelta(minutes=5)
    services.request_hide(request_id=row.request_id, user=me, until=later)
    assert RequestHide.objects.get(request=row, user=me).until == later
    with pytest.raises(InvalidInput, match="until: must be in the future"):
        services.request_hide(
            request_id=row.request_id, user=me, until=timezone.now() - timedelta(minutes=1)
        )
    with pytest.raises(InvalidInput, match="until: give a time zone"):
        services.request_hide(
            request_id=row.request_id,
            user=me,
            until=(timezone.now() + timedelta(hours=1)).replace(tzinfo=None),
        )


def test_hiding_needs_the_view_permission_and_a_visible_agent():
    row = make_request()
    with pytest.raises(NotAllowed):
        services.request_hide(request_id=row.request_id, user=make_user(role="nobody"))
    services.request_hide(request_id=row.request_id, user=make_user(role="watcher"))  # may view
    group = Group.objects.create(name="Others")
    policy = AgentPolicy.objects.create(agent="demo")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=True)
    with pytest.raises(ApprovalRequest.DoesNotExist):
        services.request_hide(request_id=row.request_id, user=make_user())


# -- claims -----------------------------------------------------------------------------


@pytest.fixture
def announced():
    """The (run_id, request_pk) of every change announced after commit."""
    heard: list[tuple[int, int | None]] = []

    def receiver(sender, run_id, request_pk, **kwargs):
        heard.append((run_id, request_pk))

    events.changed.connect(receiver)
    yield heard
    events.changed.disconnect(receiver)


def _actions(row) -> list[str]:
    return list(Event.objects.filter(request=row).order_by("id").values_list("action", flat=True))


def test_claim_release_and_takeover_are_audited_and_announced(
    django_capture_on_commit_callbacks, announced, settings
):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    ann, bob = make_user(username="ann"), make_user(username="bob")
    row = make_request()
    with django_capture_on_commit_callbacks(execute=True):
        claimed = services.request_claim(request_id=row.request_id, user=ann)
    assert claimed.claimed_by == ann and claimed.claimed_at is not None
    assert announced == [(row.run_id, row.pk)]

    with pytest.raises(ClaimedByOther, match="claimed by ann") as caught:
        services.request_claim(request_id=row.request_id, user=bob)
    assert caught.value.claimed_by == "ann" and caught.value.status == 409
    with pytest.raises(ClaimedByOther, match="claimed by ann"):
        services.request_release(request_id=row.request_id, user=bob)

    # claiming again refreshes one's own claim, without another audit event
    first = claimed.claimed_at
    again = services.request_claim(request_id=row.request_id, user=ann)
    assert again.claimed_at >= first and _actions(row) == ["claimed"]

    taken = services.request_claim(request_id=row.request_id, user=bob, takeover=True)
    assert taken.claimed_by == bob
    event = Event.objects.get(request=row, action="claim taken over")
    assert event.actor == bob and event.detail["previous"] == "ann"

    with django_capture_on_commit_callbacks(execute=True):
        released = services.request_release(request_id=row.request_id, user=bob)
    assert released.claimed_by is None and released.claimed_at is None
    assert _actions(row) == ["claimed", "claim taken over", "released"]
    assert announced[-1] == (row.run_id, row.pk)
    services.request_release(request_id=row.request_id, user=bob)  # nothing held: no-op
    assert _actions(row) == ["claimed", "claim taken over", "released"]


def test_a_lapsed_claim_is_replaced_without_takeover(settings):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    ann, bob = make_user(username="ann2"), make_user()
    row = make_request()
    claim(row, ann, minutes_ago=45)
    taken = services.request_claim(request_id=row.request_id, user=bob)
    assert taken.claimed_by == bob
    assert _actions(row) == ["claimed"]


def test_claim_needs_decide_rights_and_a_pending_request():
    row = make_request()
    with pytest.raises(NotAllowed):
        services.request_claim(request_id=row.request_id, user=make_user(role="watcher"))
    group = Group.objects.create(name="Watch demo")
    policy = AgentPolicy.objects.create(agent="demo")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=False)
    viewer = make_user()
    viewer.groups.add(group)
    viewer = type(viewer).objects.get(pk=viewer.pk)
    with pytest.raises(NotAllowed, match="may not decide requests of agent 'demo'"):
        services.request_claim(request_id=row.request_id, user=viewer)
    with pytest.raises(ApprovalRequest.DoesNotExist):  # hidden from a non-member
        services.request_claim(request_id=row.request_id, user=make_user())
    with pytest.raises(ApprovalRequest.DoesNotExist):
        services.request_claim(request_id="no-such-request", user=make_user(role="superuser"))

    admin = make_user(role="superuser")
    services.request_decline(request_id=row.request_id, user=admin, reason="no")
    with pytest.raises(AlreadyDecided):
        services.request_claim(request_id=row.request_id, user=admin)


def test_deciding_keeps_the_claim_as_history():
    user = make_user()
    run = start_and_halt(user=make_user())
    row = run.requests.get()
    services.request_claim(request_id=row.request_id, user=user)
    services.request_decline(request_id=row.request_id, user=user, reason="no")
    row.refresh_from_db()
    assert row.state == "declined" and row.claimed_by == user
    assert selectors.active_claim(row) is None
