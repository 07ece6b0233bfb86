"""Fixtures for app tests: extra agents registered for one test and removed after it."""

from __future__ import annotations

import pytest

from approvals import agents
from approvals.agents.demo import demo_generate, demo_tools, issue_refund
from toolnexus import Tool, create_in_process_client
from toolnexus.approval import approval_required

from .factories import TOOL_RUNS, count_tool, crash_agent_model, registered_mock_agent


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


@pytest.fixture
def crash_agent():
    """`crashy`: a plain native tool `count` and an approval-gated `gated_count`."""
    TOOL_RUNS.clear()

    def tools():
        plain = Tool("count", "count a call", {"type": "object"}, execute=count_tool)
        gated = approval_required(
            Tool("gated_count", "count after approval", {"type": "object"}, execute=count_tool)
        )
        return [plain, gated]

    agents.register(
        "crashy",
        model=lambda: create_in_process_client(generate=crash_agent_model),
        tools=tools,
        replace=True,
    )
    yield
    agents.unregister("crashy")
    TOOL_RUNS.clear()


@pytest.fixture
def in_memory_layer(settings):
    """A fresh in-memory layer per test (changing the setting drops the cached layer)."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
