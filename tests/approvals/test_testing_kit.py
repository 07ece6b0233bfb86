"""The testing kit a host project uses (approvals.testing and its pytest plugin), on both
kinds of test database: inside a test's transaction (pytest-django's `db`, where commit hooks
never run by themselves) and with real commits (`transactional_db`)."""

from __future__ import annotations

import pytest
from django.db import connection

from approvals import agents, testing
from approvals.live.groups import INBOX_GROUP, run_group
from approvals.testing.pytest_plugin import (  # the plugin's fixtures, as a conftest would
    approvals_agent,  # noqa: F401
    approvals_kit,  # noqa: F401
    approvals_pushes,  # noqa: F401
    approvals_user,  # noqa: F401
)
from toolnexus.relay import relay_tool

REFUND = relay_tool(
    "refund",
    "refund an order",
    {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]},
)


# Each test runs on both kinds of test database.
BOTH = pytest.mark.parametrize(
    "committing",
    [
        pytest.param(False, marks=pytest.mark.django_db, id="in-a-test-transaction"),
        pytest.param(True, marks=pytest.mark.django_db(transaction=True), id="committing"),
    ],
)


def _check_mode(committing: bool) -> None:
    assert connection.in_atomic_block is not committing


def _refund_agent(approvals_agent):  # noqa: F811
    return approvals_agent(
        "shop",
        testing.call("refund", order="A-1"),
        "model read: {results}",
        tools=[REFUND],
        executors={"refund": lambda args: f"refunded {args['order']}"},
    )


@BOTH
def test_halt_approve_resume(committing, approvals_kit, approvals_agent):  # noqa: F811
    _check_mode(committing)
    model = _refund_agent(approvals_agent)
    run = approvals_kit.start_and_halt(agent="shop", prompt="refund A-1")
    assert run.status == "pending"
    assert run.requests.get().kind == "tool_call"
    run = approvals_kit.approve(run)
    assert run.status == "done"
    assert run.text == "model read: refunded A-1"
    assert len(model.requests) == 2  # one model call per turn, resumed from the transcript


@BOTH
def test_halt_decline_resume(committing, approvals_kit, approvals_agent):  # noqa: F811
    _check_mode(committing)
    _refund_agent(approvals_agent)
    run = approvals_kit.start_and_halt(agent="shop", prompt="refund A-1")
    run = approvals_kit.decline(run, "over the limit", user=approvals_kit.make_user())
    assert run.status == "done"
    assert run.text == "model read: relay declined for refund: over the limit"


def test_the_agent_is_gone_after_the_test():
    assert agents.get("shop") is None


@BOTH
def test_pushes_are_recorded(committing, approvals_kit, approvals_agent):  # noqa: F811
    _check_mode(committing)
    _refund_agent(approvals_agent)
    with testing.record_pushes() as pushes:
        run = approvals_kit.start_and_halt(agent="shop", prompt="refund A-1")
        (created,) = pushes.wait(type="approvals.request", group=INBOX_GROUP)
        assert created.message["created"] and created.message["state"] == "pending"
        assert pushes.wait(group=run_group(run.pk))
        approvals_kit.approve(run)
        decided = pushes.wait(2, type="approvals.request")[-1]
        assert decided.message["state"] == "approved"
    with pytest.raises(AssertionError, match="expected 1 push"):
        pushes.wait(type="no.such.type", timeout=0.1)


def test_the_pushes_fixture(approvals_kit, approvals_agent, approvals_pushes):  # noqa: F811
    _refund_agent(approvals_agent)
    approvals_kit.start_and_halt(agent="shop", prompt="refund A-1")
    assert approvals_pushes.wait(type="approvals.request")


def test_users_by_role(approvals_user):  # noqa: F811
    from approvals.permissions import DECIDE_PERMISSION, VIEW_REQUESTS

    reviewer, watcher, nobody = (approvals_user(role=r) for r in ("reviewer", "watcher", "nobody"))
    assert reviewer.has_perm(DECIDE_PERMISSION)
    assert watcher.has_perm(VIEW_REQUESTS) and not watcher.has_perm(DECIDE_PERMISSION)
    assert not nobody.has_perm(VIEW_REQUESTS)
    with pytest.raises(ValueError, match="role"):
        approvals_user(role="boss")


def test_scripted_turns():
    """A turn per model call, counted from the transcript: a resumed run goes on where the
    script stopped, in a fresh client."""
    from toolnexus import InProcessRequest

    model = testing.ScriptedModel(
        [testing.call("a", id="c1"), testing.call("b", id="c2")],
        testing.reply("two done"),
    )

    def ask(messages):
        return model.generate(InProcessRequest(messages=messages, tools=[], model="m", body={}))

    first = ask([{"role": "user", "content": "go"}])
    assert [c.name for c in first.tool_calls] == ["a", "b"]
    assert ask([{"role": "user"}, {"role": "assistant"}, {"role": "tool"}]).content == "two done"
    assert ask([{"role": "assistant"}] * 2).content == "done"
