"""The testing kit a host project uses (approvals.testing and its pytest plugin), on both
kinds of test database: inside a test's transaction (pytest-django's `db`, where commit hooks
never run by themselves) and with real commits (`transactional_db`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

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


# -- a host project's own agents, and what the kit asks for -----------------------------------

PROJECT_AGENT = "kit-projects-own-agent"


@pytest.fixture(scope="module")
def projects_agent():
    """An agent the project registers itself (its agents.py), for every test of the module."""
    agent = agents.register(
        PROJECT_AGENT, model=testing.ScriptedModel("the project's own").client, replace=True
    )
    yield agent
    agents.unregister(PROJECT_AGENT)


@pytest.mark.django_db
def test_a_test_may_override_a_projects_agent(projects_agent, approvals_kit, approvals_agent):  # noqa: F811
    approvals_agent(PROJECT_AGENT, "scripted for this test")
    approvals_agent(
        PROJECT_AGENT, "scripted again"
    )  # twice: the project's is still what comes back
    assert agents.get(PROJECT_AGENT) is not projects_agent
    run = approvals_kit.start(agent=PROJECT_AGENT, prompt="hello")
    assert run.text == "scripted again"


@pytest.mark.django_db
def test_the_projects_agent_is_back_after_the_override(projects_agent, approvals_kit):  # noqa: F811
    """Before, the override was unregistered at teardown, and this test failed with "no agent
    named ..."."""
    assert agents.get(PROJECT_AGENT) is projects_agent
    run = approvals_kit.start(agent=PROJECT_AGENT, prompt="hello")
    assert run.text == "the project's own"


def test_overriding_a_projects_agent_twice_puts_the_projects_back(projects_agent):
    """What the approvals_agent fixture does at teardown, checked in one test (the test above
    and the one after it depend on their order)."""
    with testing.scripted_agents() as register:
        register(PROJECT_AGENT, "scripted")
        register(PROJECT_AGENT, "scripted again")
        register("kit-other-new-name", "new")
        assert agents.get(PROJECT_AGENT) is not projects_agent
    assert agents.get(PROJECT_AGENT) is projects_agent
    assert agents.get("kit-other-new-name") is None


def test_scripted_agent_puts_the_projects_agent_back(projects_agent):
    with testing.scripted_agent(PROJECT_AGENT, "for a while"):
        assert agents.get(PROJECT_AGENT) is not projects_agent
    assert agents.get(PROJECT_AGENT) is projects_agent
    with testing.scripted_agent("kit-new-name", "for a while"):
        assert agents.get("kit-new-name") is not None
    assert agents.get("kit-new-name") is None


@pytest.mark.django_db
def test_start_and_halt_asks_which_agent():
    """A host project has no demo agent: the kit no longer picks it for a test that names
    none (which then failed with "no agent named 'demo'" in a host project)."""
    with pytest.raises(TypeError, match="agent"):
        testing.start_and_halt(prompt="Refund order A-1")


def test_the_plugin_says_it_needs_pytest_django(monkeypatch):
    monkeypatch.setitem(sys.modules, "pytest_django", None)  # not installed
    monkeypatch.delitem(sys.modules, "approvals.testing.pytest_plugin")
    with pytest.raises(ImportError, match="pip install pytest-django"):
        importlib.import_module("approvals.testing.pytest_plugin")


def test_the_readmes_test_section_names_pytest_django():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    start = readme.index("**Tests.** The testing kit")
    section = readme[start : readme.index("```ini", start)]
    assert "pytest-django" in section and "pip install pytest pytest-django" in section
