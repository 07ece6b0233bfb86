"""What a decision costs: the query ceilings guard the decision path against regressions
(every statement is a round trip on PostgreSQL while the reviewer waits)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.contrib.auth.models import Permission
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import agents, services
from approvals.agents.demo import demo_generate
from approvals.models import Run
from approvals.testing import drain
from toolnexus import create_in_process_client
from toolnexus.relay import relay_tool

from .factories import bearer, make_user, post_json, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")


def _statements(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(TRANSACTION_CONTROL)]


# -- permissions -----------------------------------------------------------------------------


def test_a_permission_check_reads_user_and_group_permissions_in_one_query():
    reviewer = make_user(role="reviewer")  # the permission comes from the Reviewers group
    with CaptureQueriesContext(connection) as ctx:
        assert reviewer.has_perm("approvals.decide_request")
        assert reviewer.has_perm("approvals.view_run")  # cached on the user object
    assert len(_statements(ctx)) == 1


def test_direct_user_permissions_count_and_inactive_or_unpermitted_users_have_none():
    nobody = make_user(role="nobody")
    assert not nobody.has_perm("approvals.decide_request")
    assert nobody.get_all_permissions() == set()

    direct = make_user(role="nobody")
    direct.user_permissions.add(Permission.objects.get(codename="decide_request"))
    direct = type(direct).objects.get(pk=direct.pk)  # no cached permissions
    assert direct.has_perm("approvals.decide_request")
    assert not direct.has_perm("approvals.add_run")

    inactive = make_user(role="reviewer")
    inactive.is_active = False
    assert not inactive.has_perm("approvals.decide_request")

    watcher = make_user(role="watcher")
    assert watcher.has_perm("approvals.view_run")
    assert not watcher.has_perm("approvals.decide_request")


# -- the decision path ---------------------------------------------------------------------


def test_declining_through_the_api_stays_within_its_query_budget():
    user = make_user()
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    headers = bearer(user)
    client = Client()
    client.get("/api/requests", headers=headers)  # the token's last-used stamp is written now
    with CaptureQueriesContext(connection) as ctx:
        response = post_json(
            client, f"/api/requests/{request_id}/decline", {"reason": "no"}, headers=headers
        )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "declined" and body["decision"]["reason"] == "no"
    assert body["decision"]["decided_by"] == user.username
    assert [c["decision"] for c in body["calls"]] == ["decline"]
    statements = _statements(ctx)
    # token, permissions, lock request, lock calls, update call, update request, queue the run
    # (one conditional UPDATE; a locking read and an UPDATE before issue 15's fourth cut), one
    # insert for both audit events, enqueue the resume (and NOTIFY the workers on
    # PostgreSQL); the reply's calls are the ones just saved, not read again
    budget = 10 if connection.vendor == "postgresql" else 9
    assert len(statements) <= budget, "\n".join(statements)
    assert sum(s.startswith('INSERT INTO "approvals_event"') for s in statements) == 1


def test_a_decision_queues_its_run_in_one_update_without_reading_it():
    """The run's row is locked, checked and queued by one conditional UPDATE (before issue
    15's fourth cut: a locking read of the row, then its UPDATE)."""
    user = make_user()
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    with CaptureQueriesContext(connection) as ctx:
        services.request_decline(request_id=request_id, user=user, reason="no")
    statements = _statements(ctx)
    assert not [s for s in statements if s.startswith("SELECT") and '"approvals_run"' in s]
    (update,) = [s for s in statements if s.startswith('UPDATE "approvals_run"')]
    assert '"messages"' not in update and "pending" in update
    run.refresh_from_db()
    assert run.status == "queued" and run.version == 3  # created 0, claimed 1, halted 2


def test_a_runs_first_step_reads_no_request():
    """A run with no transcript never halted, so its first step looks for no decided
    request to apply."""
    run = services.run_start(agent="demo", prompt="refund order A-1001", started_by=make_user())
    with CaptureQueriesContext(connection) as ctx:
        assert drain() == 1
    run.refresh_from_db()
    assert run.status == "pending"
    reads = [s for s in _statements(ctx) if s.startswith("SELECT")]
    assert not [s for s in reads if "approvals_approvalrequest" in s or "requestcall" in s]


# -- the resume a decision causes ------------------------------------------------------------


def _refund(args):
    return f"paid {args['amount']}"


@pytest.fixture
def refund_agent():
    agents.register(
        "cost_refund",
        model=lambda: create_in_process_client(generate=demo_generate),
        tools=lambda: [
            relay_tool(
                "refund",
                "refund",
                {
                    "type": "object",
                    "properties": {"order": {"type": "string"}, "amount": {"type": "number"}},
                    "required": ["order", "amount"],
                },
            )
        ],
        executors={"refund": _refund},
        replace=True,
    )
    yield "cost_refund"
    agents.unregister("cost_refund")


@contextmanager
def _counting_transactions():
    """Count the transactions the default connection runs: commits of atomic blocks, plus
    every statement run in autocommit mode (each one its own transaction)."""
    wrapper = connections["default"]
    counts = {"transactions": 0}
    real_commit = wrapper._commit

    def commit():
        counts["transactions"] += 1
        return real_commit()

    def each(execute, sql, params, many, context):
        if not wrapper.in_atomic_block and wrapper.get_autocommit():
            counts["transactions"] += 1
        return execute(sql, params, many, context)

    wrapper._commit = commit
    try:
        with wrapper.execute_wrapper(each):
            yield counts
    finally:
        del wrapper._commit


def _resume(agent: str, decide) -> tuple[list[str], int, Run]:
    user = make_user()
    run = start_and_halt(agent=agent, prompt="Refund order A-4004, $44", user=user)
    assert run.status == "pending"
    decide(run.requests.get().request_id, user)
    with CaptureQueriesContext(connection) as ctx, _counting_transactions() as counts:
        assert drain() == 1
    run.refresh_from_db()
    assert run.status == "done", run.error
    return _statements(ctx), counts["transactions"], run


def test_an_approved_relay_resume_stays_within_its_budget(refund_agent):
    """The worker's side of an approval whose executor runs: claim the task row, the run and
    read the decided request with its calls (one transaction); journal the executor's
    start; its result with the call's row and the answer built from it (one transaction);
    the transcript with the answer applied and the model's final reply stored with the
    outcome, which also finishes the task row (one transaction: nothing with an effect runs
    between them, and a model call repeated after a crash has none)."""
    statements, transactions, run = _resume(
        refund_agent, lambda rid, user: services.request_approve(request_id=rid, user=user)
    )
    assert "paid 44" in run.text or "paid 44" in str(run.messages)
    # drain() ends with one poll that finds the queue empty (a statement, a transaction).
    # Before issue 15's cuts: 24 statements, 13 transactions on PostgreSQL (the request and
    # its calls read in two transactions of their own, the call's result and the answer
    # stored apart from the journal, the final reply checkpointed before the outcome), then
    # 20 and 9 (the answered turn checkpointed before the model call, the task row finished
    # in a commit of its own, the answer apart from the executor's result), then 18 and 6
    # (the task row claimed in a transaction of its own), then 16 (the executor's journal entry
    # one INSERT, the outcome one conditional UPDATE of the run without reading it first), then
    # 15 (the run claimed by one conditional UPDATE that reads it back).
    assert len(statements) <= 15, "\n".join(statements)
    if connection.vendor == "postgresql":
        assert transactions <= 5, (transactions, "\n".join(statements))
    # The transcript is written once: with the outcome (the claim only reads it back).
    assert sum(_writes_transcript(s) for s in statements) == 1


def _writes_transcript(statement: str) -> bool:
    return statement.startswith("UPDATE") and '"messages" = ' in statement.split(" WHERE ")[0]


def test_a_declined_relay_resume_stays_within_its_budget(refund_agent):
    """Claim the task row and the run with the decided request (one transaction), store the
    answered turn and the final reply with the outcome and the task row's end."""
    statements, transactions, _ = _resume(
        refund_agent,
        lambda rid, user: services.request_decline(request_id=rid, user=user, reason="no"),
    )
    # With drain()'s last, empty poll. Before issue 15's cuts: 18 statements, 9 transactions;
    # then 15 and 6, then 13 and 4, then 12 and 3, then 11 (the claim one UPDATE).
    assert len(statements) <= 11, "\n".join(statements)
    if connection.vendor == "postgresql":
        assert transactions <= 3, (transactions, "\n".join(statements))
