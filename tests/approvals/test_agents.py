"""The agent registry (the host API in api.md)."""

from __future__ import annotations

import sys

import pytest

from approvals import agents, services
from approvals.agents.demo import demo_generate
from approvals.agents.discovery import autodiscover
from toolnexus import Client, Tool, ToolResult, create_in_process_client
from toolnexus.relay import relay_tool

from .factories import drain, fresh, make_user, start_and_halt, tool_output

SCHEMA = {"type": "object", "properties": {"x": {"type": "number"}}}


def _model():
    return create_in_process_client(generate=demo_generate)


def _native(args, ctx):
    return ToolResult("ok")


@pytest.fixture
def scratch():
    """Names registered by a test are removed after it."""
    names: list[str] = []
    yield names
    for name in names:
        agents.unregister(name)


def test_demo_agent_is_registered_at_start_up():
    demo = agents.get("demo")
    assert demo is not None
    assert "demo" in [a.name for a in agents.all()]
    assert {t.name for t in demo.build_tools()} >= {"refund", "send_email", "delete_account"}
    assert demo.executor_for("refund") is not None
    assert demo.executor_for("send_email") is None


def test_register_get_all_unregister(scratch):
    scratch += ["zeta", "alpha"]
    agents.register("zeta", model=_model, tools=[relay_tool("refund", "r", SCHEMA)])
    agent = agents.register(
        "alpha",
        model=_model,
        tools=lambda: [relay_tool("refund", "r", SCHEMA)],
        executors={"refund": lambda args: "done"},
        system_prompt="be brief",
        description="first",
    )
    assert agents.get("alpha") is agent
    assert agent.system_prompt == "be brief" and agent.description == "first"
    names = [a.name for a in agents.all()]
    assert names == sorted(names)
    assert {"alpha", "zeta"} <= set(names)
    assert agents.require("alpha") is agent
    agents.unregister("alpha")
    assert agents.get("alpha") is None
    with pytest.raises(agents.UnknownAgent):
        agents.require("alpha")


def test_duplicate_name_is_refused_unless_replacing(scratch):
    scratch.append("dup")
    first = agents.register("dup", model=_model, tools=[])
    with pytest.raises(ValueError, match="already registered"):
        agents.register("dup", model=_model, tools=[])
    assert agents.get("dup") is first
    second = agents.register("dup", model=_model, tools=[], replace=True)
    assert agents.get("dup") is second


def test_executor_naming_a_non_relay_tool_is_refused(scratch):
    scratch.append("bad")
    native = Tool("refund", "a native tool", SCHEMA, execute=_native)
    with pytest.raises(ValueError, match="executor 'refund'"):
        agents.register("bad", model=_model, tools=[native], executors={"refund": print})
    assert agents.get("bad") is None
    with pytest.raises(ValueError, match="executor 'missing'"):
        agents.register(
            "bad",
            model=_model,
            tools=[relay_tool("refund", "r", SCHEMA)],
            executors={"missing": print},
        )
    assert agents.get("bad") is None


def test_executor_check_applies_to_tool_factories_when_built(scratch):
    scratch.append("lazy")
    native = Tool("refund", "a native tool", SCHEMA, execute=_native)
    agent = agents.register(
        "lazy", model=_model, tools=lambda: [native], executors={"refund": print}
    )
    with pytest.raises(ValueError, match="names no relay tool"):
        agent.build_tools()


@pytest.mark.parametrize("name", ["", "x" * 101, None])
def test_agent_names_are_validated(name):
    with pytest.raises((ValueError, TypeError)):
        agents.register(name, model=_model, tools=[])


def test_model_must_be_a_factory_returning_a_client(scratch):
    scratch.append("m")
    with pytest.raises(TypeError):
        agents.register("m", model=_model(), tools=[])
    agent = agents.register("m", model=lambda: "not a client", tools=[])
    with pytest.raises(TypeError, match="not a toolnexus Client"):
        agent.build_client()
    agent = agents.register("m", model=_model, tools=[], system_prompt="agent prompt", replace=True)
    assert isinstance(agent.build_client(), Client)
    assert agent.build_client().system_prompt == "agent prompt"
    assert agent.build_client("the run's prompt").system_prompt == "the run's prompt"


def test_model_and_tools_factories_are_called_per_execution(scratch):
    scratch.append("counted")
    made = {"model": 0, "tools": 0}

    def model():
        made["model"] += 1
        return _model()

    def tools():
        made["tools"] += 1
        return [relay_tool("refund", "r", SCHEMA)]

    agent = agents.register("counted", model=model, tools=tools)
    agent.build_client()
    agent.build_client()
    agent.build_tools()
    assert made == {"model": 2, "tools": 1}


def test_agent_modules_setting_is_imported_by_autodiscover(settings):
    module = "tests.approvals.extra_agents"
    agents.unregister("extra")
    sys.modules.pop(module, None)
    settings.TOOLNEXUS_AGENT_MODULES = [module]
    try:
        autodiscover()
        extra = agents.get("extra")
        assert extra is not None
        assert extra.description == "registered by TOOLNEXUS_AGENT_MODULES"
        assert agents.get("demo") is not None  # still there, not registered twice
    finally:
        agents.unregister("extra")
        sys.modules.pop(module, None)


def test_agent_modules_setting_with_a_missing_module_fails_loudly(settings):
    settings.TOOLNEXUS_AGENT_MODULES = ["tests.approvals.no_such_agents_module"]
    with pytest.raises(ModuleNotFoundError):
        autodiscover()


@pytest.mark.django_db(transaction=True)
def test_a_run_resumes_with_the_system_prompt_it_started_with(scratch):
    scratch.append("prompted")
    seen: list[str] = []

    def generate(request):
        seen.append(request.messages[0]["content"])
        return demo_generate(request)

    def register(prompt: str):
        agents.register(
            "prompted",
            model=lambda: create_in_process_client(generate=generate),
            tools=[relay_tool("refund", "r", SCHEMA)],
            system_prompt=prompt,
            replace=True,
        )

    register("version one")
    user = make_user()
    run = start_and_halt(agent="prompted", user=user)
    assert run.system_prompt == "version one"
    register("version two")
    services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert seen == ["version one", "version one"]
    assert tool_output(run, "call_refund") == "relay declined for refund: no"


@pytest.mark.django_db(transaction=True)
def test_a_registered_agent_with_an_async_executor_runs_it(scratch):
    scratch.append("asyncexec")
    calls: list[dict] = []

    async def executor(args):
        calls.append(args)
        return f"async refund {args['amount']}"

    agents.register(
        "asyncexec",
        model=_model,
        tools=[relay_tool("refund", "r", {"type": "object"})],
        executors={"refund": executor},
    )
    user = make_user()
    run = start_and_halt(agent="asyncexec", prompt="refund A-1 $3", user=user)
    services.request_approve(request_id=run.requests.get().request_id, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "async refund 3"
    assert len(calls) == 1


@pytest.mark.django_db(transaction=True)
def test_an_executor_exception_becomes_an_error_output(scratch):
    scratch.append("boom")

    def executor(args):
        raise RuntimeError("payments down")

    agents.register(
        "boom",
        model=_model,
        tools=[relay_tool("refund", "r", {"type": "object"})],
        executors={"refund": executor},
    )
    user = make_user()
    run = start_and_halt(agent="boom", prompt="refund A-1 $3", user=user)
    request = run.requests.get()
    services.request_approve(request_id=request.request_id, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert "payments down" in tool_output(run, "call_refund")
    call = request.calls.get()
    assert call.is_error is True and "payments down" in call.output


@pytest.mark.parametrize(
    ("prompt", "order", "amount"),
    [
        ("Refund order B-1 $5", "B-1", 5),
        ("Refund order A-2002, $40", "A-2002", 40),
        ("refund order 42 for $3", "42", 3),
        ("Refund order #77 of 12 dollars", "77", 12),
        ("Refund #12345 please", "12345", 250),
        ("Refund AB-77 now", "AB-77", 250),
        ("Refund my order", "A-1001", 250),  # nothing named: the demo's own example
        # "order <id>" in any case, kept as spelled, wins over an id elsewhere in the text
        ("Order b-1: refund $5", "b-1", 5),
        ("REFUND ORDER 42 FOR $3", "42", 3),
        ("Refund order 42, see ticket T-9", "42", 250),
        ("Per AB-7 policy, refund Order b-12 $20", "b-12", 20),
        ("Refund order no. 5 of 7 dollars", "5", 7),
        ("Refund order number 9", "9", 250),
        ("Refund order id: C-3 now", "C-3", 250),
        ("refund ab-77 now", "ab-77", 250),  # no "order": the id pattern, any case
        ("Refund the order of ticket T-9", "T-9", 250),  # "order of" names no order
    ],
)
def test_the_demo_agent_reads_the_order_and_amount_the_prompt_names(prompt, order, amount):
    from approvals.agents.demo import _plan

    refund = _plan(prompt)[0]
    assert (refund.name, refund.arguments) == ("refund", {"order": order, "amount": amount})
