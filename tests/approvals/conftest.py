"""Fixtures for app tests: extra agents registered for one test and removed after it."""

from __future__ import annotations

import pytest

from approvals import agents
from approvals.agents.demo import demo_generate, demo_tools, issue_refund
from toolnexus import create_in_process_client

from .factories import registered_mock_agent


@pytest.fixture
def second_demo_agent():
    """`demo2`: the demo's model and tools under another name (for agent filters)."""
    agent = agents.register(
        "demo2",
        model=lambda: create_in_process_client(generate=demo_generate, model="demo2"),
        tools=demo_tools,
        executors={"refund": issue_refund},
        description="a second demo",
        replace=True,
    )
    yield agent
    agents.unregister("demo2")


@pytest.fixture
def mock_model():
    """`remote`: an agent whose model is an OpenAI-style endpoint on httpx.MockTransport,
    with the demo's tools; set `mock_model.fail = True` to make the endpoint answer 500."""
    with registered_mock_agent("remote", tool_input={"order": "B-7", "amount": 9}) as model:
        yield model


@pytest.fixture
def typed_output_agent():
    """`demo-typed`: the demo, but reviewers may type refund's result instead of running it."""
    agents.register(
        "demo-typed",
        model=lambda: create_in_process_client(generate=demo_generate, model="demo-typed"),
        tools=demo_tools,
        executors={"refund": issue_refund},
        allow_typed_output=True,
        replace=True,
    )
    yield "demo-typed"
    agents.unregister("demo-typed")
