"""The demo ships two example rules, off: `serve` makes them once (with the demo agent), and
switched on they decide the demo agent's calls."""

from __future__ import annotations

import io

import pytest

from approvals import testing
from approvals.management.commands.serve import Command
from approvals.models import ApprovalRequest, Event, Rule
from approvals.services.rules import DEMO_RULES, RULE_CREATED, ensure_demo_rules

pytestmark = pytest.mark.django_db

State = ApprovalRequest.State
SMALL, ADMIN = (fields["name"] for fields in DEMO_RULES)


def test_the_demo_rules_are_made_off_once_each_with_an_audit_entry():
    made = ensure_demo_rules()
    assert [r.name for r in made] == [SMALL, ADMIN]
    assert [(r.enabled, r.agent, r.tool, r.effect) for r in Rule.objects.order_by("id")] == [
        (False, "demo", "refund", "approve"),
        (False, "demo", "delete_account", "decline"),
    ]
    entries = Event.objects.filter(action=RULE_CREATED).order_by("id")
    assert [(e.actor, e.run, e.detail["demo"], e.detail["rule"]["name"]) for e in entries] == [
        (None, None, True, SMALL),
        (None, None, True, ADMIN),
    ]
    assert ensure_demo_rules() == []
    assert Rule.objects.count() == 2 and entries.count() == 2


def test_a_demo_rule_switched_on_or_deleted_is_left_so():
    small, admin = ensure_demo_rules()
    Rule.objects.filter(pk=small.pk).update(enabled=True)
    admin.delete()
    assert ensure_demo_rules() == []
    assert list(Rule.objects.values_list("name", "enabled")) == [(SMALL, True)]


def test_off_they_decide_nothing():
    ensure_demo_rules()
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.status == "pending"
    assert run.requests.get().state == State.PENDING


def test_switched_on_small_refunds_pass_and_admin_accounts_are_never_deleted():
    ensure_demo_rules()
    Rule.objects.update(enabled=True)
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.status == "done", run.error
    assert run.requests.get().decided_by_rule.name == SMALL
    run = testing.start(agent="demo", prompt="Refund $250 on order A-1")
    assert run.status == "pending"  # over 50: a person decides
    run = testing.start(agent="demo", prompt="Delete account admin-7")
    assert run.status == "done", run.error
    row = run.requests.get()
    assert row.state == State.DECLINED and row.decided_by_rule.name == ADMIN
    assert row.reason == "an agent never deletes an admin account"
    run = testing.start(agent="demo", prompt="Delete account acct-42")
    assert run.status == "pending"


def test_serve_makes_them_and_says_so():
    out, err = io.StringIO(), io.StringIO()
    command = Command(stdout=out, stderr=err)
    command._demo_rules()
    assert f"demo rule: {SMALL} (off; switch it on at /rules/)" in out.getvalue()
    assert Rule.objects.count() == 2
    command._demo_rules()
    assert Rule.objects.count() == 2
