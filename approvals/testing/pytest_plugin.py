"""pytest fixtures for projects that use the app (needs pytest-django). In a conftest.py:

    pytest_plugins = ["approvals.testing.pytest_plugin"]

    def test_a_declined_refund(approvals_kit, approvals_agent):
        approvals_agent("support", approvals_kit.call("refund", order="A-1"), "{results}",
                        tools=[relay_tool("refund", "refund an order")])
        run = approvals_kit.start_and_halt(agent="support", prompt="refund A-1")
        run = approvals_kit.decline(run, "over the limit")
        assert "over the limit" in run.text

Every fixture uses the test database (`db`): Django's default test databases do, in-memory
SQLite included.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# The fixtures take pytest-django's `db`: without it, say so (not "fixture 'db' not found").
try:
    import pytest_django  # noqa: F401
except ImportError:
    raise ImportError(
        "approvals.testing.pytest_plugin needs pytest-django, whose `db` fixture gives it the "
        "test database: pip install pytest-django"
    ) from None

from approvals import testing as kit


@pytest.fixture
def approvals_kit(db) -> types.SimpleNamespace:
    """The helpers of `approvals.testing` (make_user, start, start_and_halt, decide,
    approve, decline, drain, call, reply), with the test database ready."""
    return types.SimpleNamespace(
        make_user=kit.make_user,
        start=kit.start,
        start_and_halt=kit.start_and_halt,
        decide=kit.decide,
        approve=kit.approve,
        decline=kit.decline,
        drain=kit.drain,
        call=kit.call,
        reply=kit.reply,
    )


@pytest.fixture
def approvals_user(db) -> Callable[..., Any]:
    """`approvals_user(role="reviewer" | "watcher" | "nobody" | "superuser")`: a new user."""
    return kit.make_user


@pytest.fixture
def approvals_agent(db) -> Iterator[Callable[..., kit.ScriptedModel]]:
    """`approvals_agent(name, *turns, tools=..., executors=...)` registers an agent with a
    scripted model (approvals.testing.ScriptedModel) for this test. After the test the
    name is as it was: a project's own agent of that name is back, a new name is gone.
    Returns the model (its `requests`: what it was asked)."""
    with kit.scripted_agents() as register:
        yield register


@pytest.fixture
def approvals_pushes(db) -> Iterator[kit.Pushes]:
    """The live pushes sent during the test (approvals.testing.record_pushes):
    `approvals_pushes.wait(type="approvals.request")`."""
    with kit.record_pushes() as pushes:
        yield pushes
