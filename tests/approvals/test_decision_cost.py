"""What each path costs, kept by tests: the statements and transactions of the halt, a
person's decision (service, API and page), the resume after an approval and after a decline,
the inbox's first page (page and API) and a decision's live push. Each budget is today's
count, stated with what its statements are; a path that grows past it fails here. The tests
run on whichever database DATABASE_URL names (SQLite without one); where the vendors differ,
the budget says so (PostgreSQL adds a NOTIFY that wakes other processes' workers).

Transactions are counted by `_counting_transactions`: each commit or rollback of an
outermost atomic block, and each statement run in autocommit mode (its own transaction)."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from django.contrib.auth.models import Permission
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import agents, services
from approvals.agents.demo import demo_generate
from approvals.live import publisher, rendering
from approvals.models import Run
from approvals.testing import drain
from toolnexus import create_in_process_client
from toolnexus.relay import relay_tool

from .factories import bearer, make_user, post_json, session_client, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")


def _statements(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(TRANSACTION_CONTROL)]


def _on_postgres() -> bool:
    return connection.vendor == "postgresql"


@dataclass(repr=False)
class Cost:
    statements: list[str] = field(default_factory=list)
    transactions: int = 0

    def within(self, statements: int, transactions: int) -> bool:
        return len(self.statements) <= statements and self.transactions <= transactions

    def __repr__(self) -> str:
        lines = "\n".join(s[:160] for s in self.statements)
        return f"{len(self.statements)} statements, {self.transactions} transactions:\n{lines}"


@contextmanager
def _cost():
    """The statements (transaction control left out) and transactions of the default
    connection inside the block."""
    cost = Cost()
    with CaptureQueriesContext(connection) as ctx, _counting_transactions() as counts:
        yield cost
    cost.statements = _statements(ctx)
    cost.transactions = counts["transactions"]


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


def test_a_halt_stays_within_its_budget():
    """A worker's first step, up to the run's pending request: the task row claimed (a
    locking read and its UPDATE) with the run (one conditional UPDATE) and the claim's audit
    event, in one transaction; the model's turn (no statement); the transcript, the request,
    its call and the halt's audit event stored with the task row's end, in one transaction;
    then drain()'s last poll, which finds the queue empty (a statement, a transaction).
    Between the turn and the halt, the enabled rules are read (one statement, a transaction
    of its own): with none, the call halts for a person."""
    run = services.run_start(
        agent="demo", prompt="Refund order A-1001, $120", started_by=make_user()
    )
    with _cost() as cost:
        assert drain() == 1
    run.refresh_from_db()
    assert run.status == "pending" and run.requests.count() == 1
    assert cost.within(statements=11, transactions=4), cost


def test_an_approval_stays_within_its_budget():
    """The decision service, as a host calls it: lock the request, lock its calls, update
    the call, update the request, queue the run (one conditional UPDATE), the audit event,
    enqueue the resume (and NOTIFY the workers on PostgreSQL), all in one transaction."""
    user = make_user()
    request_id = start_and_halt(user=user).requests.get().request_id
    user.has_perm("approvals.decide_request")  # a host's user: its permissions cached
    with _cost() as cost:
        services.request_approve(request_id=request_id, user=user)
    assert cost.within(statements=8 if _on_postgres() else 7, transactions=1), cost


def test_approving_in_the_inbox_stays_within_its_budget():
    """The page's Approve (htmx): the session, the user and their permissions (three reads);
    the claim guard's read of the request with its calls (two); the decision as above (one
    transaction, 7 statements, 8 on PostgreSQL); the card read back to answer with (two).
    Every read outside the decision is a transaction of its own (autocommit)."""
    user = make_user()
    request_id = start_and_halt(user=user).requests.get().request_id
    client = session_client(user)
    client.get("/")  # the session and its user exist
    with _cost() as cost:
        response = client.post(
            f"/requests/{request_id}/approve/", {"confirmed": "1"}, headers={"HX-Request": "true"}
        )
    assert response.status_code == 200, response.content
    assert response.headers["X-Toolnexus-Outcome"] == "success"
    assert cost.within(statements=15 if _on_postgres() else 14, transactions=8), cost


def test_declining_through_the_api_stays_within_its_query_budget():
    user = make_user()
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    headers = bearer(user)
    client = Client()
    client.get("/api/requests", headers=headers)  # the token's last-used stamp is written now
    with _cost() as cost:
        response = post_json(
            client, f"/api/requests/{request_id}/decline", {"reason": "no"}, headers=headers
        )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "declined" and body["decision"]["reason"] == "no"
    assert body["decision"]["decided_by"] == user.username
    assert [c["decision"] for c in body["calls"]] == ["decline"]
    statements = cost.statements
    # token, permissions, lock request, lock calls, update call, update request, queue the run
    # (one conditional UPDATE; a locking read and an UPDATE before issue 15's fourth cut), one
    # insert for both audit events, enqueue the resume (and NOTIFY the workers on
    # PostgreSQL); the reply's calls are the ones just saved, not read again. Transactions:
    # the token's and the permissions' reads (autocommit), the decision.
    assert cost.within(statements=10 if _on_postgres() else 9, transactions=3), cost
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
    """Count the transactions the default connection runs: commits and rollbacks of atomic
    blocks, plus every statement run in autocommit mode (each one its own transaction). A
    transaction-control statement is not one: SQLite's BEGIN runs while Django still reads
    as in autocommit mode, and its transaction is counted when it ends."""
    wrapper = connections["default"]
    counts = {"transactions": 0}
    real_commit, real_rollback = wrapper._commit, wrapper._rollback

    def commit():
        counts["transactions"] += 1
        return real_commit()

    def rollback():
        counts["transactions"] += 1
        return real_rollback()

    def each(execute, sql, params, many, context):
        if (
            not wrapper.in_atomic_block
            and wrapper.get_autocommit()
            and not sql.lstrip().upper().startswith(TRANSACTION_CONTROL)
        ):
            counts["transactions"] += 1
        return execute(sql, params, many, context)

    wrapper._commit, wrapper._rollback = commit, rollback
    try:
        with wrapper.execute_wrapper(each):
            yield counts
    finally:
        del wrapper._commit, wrapper._rollback


def _resume(agent: str, decide) -> tuple[list[str], int, Run]:
    user = make_user()
    run = start_and_halt(agent=agent, prompt="Refund order A-4004, $44", user=user)
    assert run.status == "pending"
    decide(run.requests.get().request_id, user)
    with _cost() as cost:
        assert drain() == 1
    run.refresh_from_db()
    assert run.status == "done", run.error
    return cost.statements, cost.transactions, run


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
    # Transactions on both databases: the claim, the executor's start, its result, the
    # outcome, drain()'s last poll.
    assert len(statements) <= 15, "\n".join(statements)
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
    # Transactions on both databases: the claim, the outcome, drain()'s last poll.
    assert len(statements) <= 11, "\n".join(statements)
    assert transactions <= 3, (transactions, "\n".join(statements))


# -- the inbox's first page -------------------------------------------------------------------


def test_the_inbox_first_page_stays_within_its_budget():
    """GET /: the session, the user, their permissions, the counts (two statements: the
    list's and title's counts, then the chips' and menus'), the page's rows with their
    runs, the rows' calls, the viewer's next snooze end (when the list redraws itself as
    it lapses); each a read in autocommit mode, so a transaction of its own. The same page with 5 or 25 requests costs the same (test_inbox_page)."""
    user = make_user()
    for n in range(3):
        start_and_halt(user=user, prompt=f"Refund order A-{n:04d}, $5")
    client = session_client(user)
    client.get("/")  # the session and its user exist
    with _cost() as cost:
        response = client.get("/")
    assert response.status_code == 200
    assert len(re.findall(r'<li id="row-\d+"', response.content.decode())) == 3
    assert cost.within(statements=8, transactions=8), cost


def test_the_apis_first_page_stays_within_its_budget():
    """GET /api/requests: the token, the user's permissions, the page's rows with their
    runs, the rows' calls, the count of all matching (each a read in autocommit mode)."""
    user = make_user()
    for n in range(3):
        start_and_halt(user=user, prompt=f"Refund order A-{n:04d}, $5")
    headers = bearer(user)
    client = Client()
    client.get("/api/requests", headers=headers)  # the token's last-used stamp is written now
    with _cost() as cost:
        response = client.get("/api/requests", headers=headers)
    assert response.status_code == 200
    assert len(response.json()["items"]) == 3
    assert cost.within(statements=5, transactions=5), cost


# -- a decision's live push ---------------------------------------------------------------------


def test_a_decisions_live_push_stays_within_its_budget():
    """What a decision costs the live pages: its messages are built from the row in memory
    (no statement); then, once per change and variant however many pages watch, a page's
    consumer renders the changed row (the request with its run, decider and claimer in one
    read, then its calls), the card for the page showing it (the same two reads) and the
    shared pending count (one); a filtered list counts for its viewer (two: its counts,
    then its chips'). Each a read in autocommit mode."""
    user = make_user()
    run = start_and_halt(user=user)
    row = services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    user.has_perm("approvals.view_run")  # a socket's user: its permissions cached
    with _cost() as messages:
        publisher.messages_for(run_id=run.pk, request_pk=row.pk, created=False, row=row)
    assert messages.within(statements=0, transactions=0), messages
    with _cost() as renderings:
        assert rendering.row_html(row.pk, filter_query="", oob=True)
        assert rendering.changed_card(row.pk, can_decide=True, oob=True)
        rendering.pending_count()
        rendering.list_counts(user, {"q": "refund", "state": "all"})
    assert renderings.within(statements=7, transactions=7), renderings
