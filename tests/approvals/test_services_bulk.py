"""approvals.services.bulk: one decision on many requests, with an outcome per request."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from approvals import services
from approvals.domain.exceptions import InvalidInput, NotAllowed
from approvals.models import AgentAccess, AgentPolicy, ApprovalRequest
from approvals.services import bulk as bulk_module

from .factories import halted_request as _halted
from .factories import make_request, make_user, start_and_halt

pytestmark = pytest.mark.django_db


def test_bulk_approve_outcomes_per_kind():
    starter, reviewer = make_user(), make_user()
    refund = _halted("Refund order A-5, $10", starter)  # relay call with an executor
    delete = make_request(kind="approval", tool="delete_account", prompt="Close account 3?")
    irreversible = _halted("Delete account acct-3", starter)  # "This cannot be undone."
    question = _halted("question", starter)
    two = _halted("email two", starter)  # refund (executor) + send_email (none)
    results = services.requests_bulk(
        request_ids=[
            refund.request_id,
            delete.request_id,
            question.request_id,
            two.request_id,
            "nope",
            refund.request_id,
        ],
        user=reviewer,
        action="approve",
    )
    by_id = {r.request_id: r for r in results}
    assert [r.request_id for r in results] == [
        refund.request_id,
        delete.request_id,
        question.request_id,
        two.request_id,
        "nope",
    ]  # once per id, in order
    assert by_id[refund.request_id].status == "done"
    assert by_id[delete.request_id].status == "done"
    assert by_id[question.request_id].status == "invalid"
    assert "typed on its card" in by_id[question.request_id].message
    again = services.requests_bulk(
        request_ids=[irreversible.request_id], user=reviewer, action="approve"
    )
    assert again[0].status == "invalid" and "cannot be undone" in again[0].message
    assert ApprovalRequest.objects.get(pk=irreversible.pk).state == "pending"
    assert by_id[two.request_id].status == "invalid"
    assert "send_email has no executor" in by_id[two.request_id].message
    assert by_id["nope"].status == "missing"
    states = dict(ApprovalRequest.objects.values_list("request_id", "state"))
    assert states[refund.request_id] == "approved" and states[delete.request_id] == "approved"
    assert states[question.request_id] == "pending" and states[two.request_id] == "pending"
    assert ApprovalRequest.objects.get(pk=refund.pk).decided_by == reviewer


def test_bulk_decline_takes_every_kind_with_one_reason():
    starter, reviewer = make_user(), make_user()
    rows = [_halted(p, starter) for p in ("Refund order A-6", "question", "email two")]
    results = services.requests_bulk(
        request_ids=[r.request_id for r in rows], user=reviewer, action="decline", reason="batch"
    )
    assert [r.status for r in results] == ["done", "done", "done"]
    assert set(ApprovalRequest.objects.values_list("state", "reason")) == {("declined", "batch")}


def test_bulk_leaves_a_request_another_reviewer_claimed(settings):
    starter, me, rita = make_user(), make_user(), make_user(username="rita")
    theirs = _halted("Refund order A-17", starter)
    mine = _halted("Refund order A-18", starter)
    free = _halted("Refund order A-19", starter)
    services.request_claim(request_id=theirs.request_id, user=rita)
    services.request_claim(request_id=mine.request_id, user=me)
    for action in ("approve", "decline"):
        results = services.requests_bulk(
            request_ids=[theirs.request_id], user=me, action=action, reason="batch"
        )
        assert results[0].status == "invalid"
        assert "claimed by rita" in results[0].message
    assert ApprovalRequest.objects.get(pk=theirs.pk).state == "pending"
    results = services.requests_bulk(
        request_ids=[mine.request_id, free.request_id], user=me, action="approve"
    )
    assert [r.status for r in results] == ["done", "done"]  # my own claim, and no claim
    # a lapsed claim no longer holds the request back
    settings.TOOLNEXUS_CLAIM_MINUTES = 1
    ApprovalRequest.objects.filter(pk=theirs.pk).update(
        claimed_at=timezone.now() - timedelta(minutes=5)
    )
    results = services.requests_bulk(request_ids=[theirs.request_id], user=me, action="approve")
    assert results[0].status == "done"


def test_bulk_reports_a_request_someone_else_decided_first(monkeypatch):
    starter, me, rita = make_user(), make_user(), make_user(username="rita")
    first = _halted("Refund order A-7", starter)
    second = _halted("Refund order A-8", starter)
    real_approve = bulk_module.request_approve

    def approve_racing(*, request_id, user):
        # rita declines the second one after the batch read it as pending
        if request_id == first.request_id:
            services.request_decline(request_id=second.request_id, user=rita, reason="mine")
        return real_approve(request_id=request_id, user=user)

    monkeypatch.setattr(bulk_module, "request_approve", approve_racing)
    results = services.requests_bulk(
        request_ids=[first.request_id, second.request_id], user=me, action="approve"
    )
    assert [r.status for r in results] == ["done", "already"]
    assert "declined by rita" in results[1].message
    assert ApprovalRequest.objects.get(pk=second.pk).decided_by == rita


def test_bulk_forbidden_for_the_starter_rule_and_hidden_agents_are_missing(
    settings, second_demo_agent
):
    settings.TOOLNEXUS_STARTER_CANNOT_APPROVE = True
    starter = make_user()
    own = _halted("Refund order A-9", starter)
    hidden = start_and_halt(
        agent="demo2", prompt="Refund order A-10", user=make_user()
    ).requests.get()
    group = Group.objects.create(name="demo2 people")
    policy = AgentPolicy.objects.create(agent="demo2")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=True)
    starter = type(starter).objects.get(pk=starter.pk)
    results = services.requests_bulk(
        request_ids=[own.request_id, hidden.request_id], user=starter, action="approve"
    )
    assert [r.status for r in results] == ["forbidden", "missing"]
    assert "second reviewer" in results[0].message
    assert ApprovalRequest.objects.filter(state="pending").count() == 2


def test_bulk_input_is_checked_first():
    user = make_user()
    with pytest.raises(InvalidInput, match="action: must be approve or decline"):
        services.requests_bulk(request_ids=["a"], user=user, action="maybe")
    with pytest.raises(InvalidInput, match="at most 500"):
        services.requests_bulk(
            request_ids=[f"r{i}" for i in range(501)], user=user, action="decline"
        )
    with pytest.raises(InvalidInput, match="ids: give at least one"):
        services.requests_bulk(request_ids=[], user=user, action="decline")
    with pytest.raises(NotAllowed):
        services.requests_bulk(request_ids=["a"], user=make_user(role="watcher"), action="decline")


@pytest.mark.django_db(transaction=True)
def test_bulk_decides_each_in_its_own_transaction_and_keeps_what_was_done(monkeypatch):
    """A later decision failing with an unexpected error leaves the earlier ones committed,
    and none was held open in a transaction around the whole batch."""
    from django.db import connection

    from .factories import in_another_connection

    starter, reviewer = make_user(), make_user()
    rows = [_halted(f"Refund order A-3{n}", starter) for n in range(3)]
    real_decline = bulk_module.request_decline
    outer_atomic = []

    def decline_then_fail(*, request_id, user, reason):
        outer_atomic.append(connection.in_atomic_block)  # a batch-wide transaction shows here
        if request_id == rows[2].request_id:
            raise RuntimeError("the database went away")
        return real_decline(request_id=request_id, user=user, reason=reason)

    monkeypatch.setattr(bulk_module, "request_decline", decline_then_fail)
    with pytest.raises(RuntimeError):
        services.requests_bulk(
            request_ids=[r.request_id for r in rows], user=reviewer, action="decline", reason="no"
        )
    assert outer_atomic == [False, False, False]
    seen = {}

    def read():  # another connection sees only what was committed
        seen.update(
            ApprovalRequest.objects.filter(pk__in=[r.pk for r in rows]).values_list("pk", "state")
        )

    in_another_connection(read)
    assert [seen[r.pk] for r in rows] == ["declined", "declined", "pending"]


def test_a_bulk_decision_is_announced_once_as_a_whole(django_capture_on_commit_callbacks):
    """Each request decided announces its change tagged with the bulk decision's id; then
    one `bulk_decided` names who decided what (only the requests decided: not the missing)."""
    from approvals import events
    from approvals.live.publisher import request_message

    reviewer = make_user()
    a, b = (
        _halted("Refund order A-7, $1", make_user()),
        _halted("Refund order A-8, $2", make_user()),
    )
    heard: dict[str, list] = {"changed": [], "bulk": []}

    def on_changed(sender, **kw):
        heard["changed"].append(kw)

    def on_bulk(sender, **kw):
        heard["bulk"].append(kw)

    events.changed.connect(on_changed)
    events.bulk_decided.connect(on_bulk)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.requests_bulk(
                request_ids=[a.request_id, "nope", b.request_id], user=reviewer, action="decline"
            )
    finally:
        events.changed.disconnect(on_changed)
        events.bulk_decided.disconnect(on_bulk)
    [whole] = heard["bulk"]
    assert (whole["user_id"], whole["username"], whole["verb"]) == (
        reviewer.pk,
        reviewer.get_username(),
        "declined",
    )
    assert whole["requests"] == [(a.pk, a.agent), (b.pk, b.agent)]
    tagged = {kw["request_pk"]: kw["bulk"] for kw in heard["changed"] if kw["request_pk"]}
    assert tagged == {a.pk: whole["bulk"], b.pk: whole["bulk"]}
    row = ApprovalRequest.objects.get(pk=a.pk)
    assert request_message(row, created=False, change="x", bulk=whole["bulk"])["bulk"]
    # a decision on its own card carries none
    c = _halted("Refund order A-9, $3", make_user())
    heard["changed"].clear()
    events.changed.connect(on_changed)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.request_decline(request_id=c.request_id, user=reviewer, reason="no")
    finally:
        events.changed.disconnect(on_changed)
    assert {kw["bulk"] for kw in heard["changed"]} == {None}
