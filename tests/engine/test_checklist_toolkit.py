"""Checklist: toolkit assembly, builtins toggles, relay collision guard, adapters,
the `question` builtin and relay tools executed directly."""

from __future__ import annotations

import json

import pytest

from tests.engine.helpers import OBJ, Probe
from toolnexus import Answer, ToolContext, ToolResult, create_toolkit, pending_of
from toolnexus.builtins import BUILTIN_NAMES
from toolnexus.relay import relay_tool

COLOR_Q = {"question": "Pick a color?", "header": "Color", "options": ["red", "green"]}


def names(tk) -> list[str]:
    return [t.name for t in tk.tools()]


# -- builtins toggles ------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [True, {}, {"enabled": True}, {"tools": {"bash": False}}])
async def test_builtins_on_exposes_question(cfg):
    async with await create_toolkit(builtins=cfg) as tk:
        assert "question" in names(tk)
        assert tk.get("question").source == "builtin"


async def test_builtins_default_is_on():
    async with await create_toolkit() as tk:
        assert "question" in names(tk)


@pytest.mark.parametrize("cfg", [False, {"enabled": False}, {"disabled": True}])
async def test_builtins_off_exposes_no_builtin(cfg):
    async with await create_toolkit(builtins=cfg, extra_tools=[Probe("mine").tool]) as tk:
        assert names(tk) == ["mine"]
        assert not set(names(tk)) & set(BUILTIN_NAMES)


async def test_builtins_tools_map_drops_a_tool_mapped_to_false():
    async with await create_toolkit(builtins={"tools": {"question": False}}) as tk:
        assert "question" not in names(tk)
        assert tk.get("question") is None


# -- lookups and execute -------------------------------------------------------------------


async def test_get_returns_none_for_an_absent_tool():
    async with await create_toolkit(builtins=False) as tk:
        assert tk.get("nope") is None


async def test_execute_unknown_tool_is_an_error_result_not_an_exception():
    async with await create_toolkit(builtins=False) as tk:
        res = await tk.execute("nope", {}, ToolContext())
    assert res.is_error and res.output == "Unknown tool: nope"


async def test_execute_runs_the_named_tool_with_args_and_ctx():
    p = Probe("echo", output=lambda a: f"got {a['x']}")
    async with await create_toolkit(builtins=False, extra_tools=[p.tool]) as tk:
        res = await tk.execute("echo", {"x": 7}, ToolContext(call_id="c9"))
    assert res.output == "got 7" and not res.is_error
    assert p.runs[0][0] == {"x": 7} and p.runs[0][1].call_id == "c9"


async def test_sync_execute_functions_are_accepted():
    from toolnexus import Tool

    t = Tool(
        name="s",
        description="sync",
        input_schema=OBJ,
        source="native",
        execute=lambda args, ctx: ToolResult(output="sync ok"),
    )
    async with await create_toolkit(builtins=False, extra_tools=[t]) as tk:
        assert (await tk.execute("s", {}, ToolContext())).output == "sync ok"


async def test_register_adds_tools_after_construction():
    async with await create_toolkit(builtins=False) as tk:
        tk.register(Probe("late").tool, relay_tool("remote", "runs at the host"))
        assert {"late", "remote"} <= set(names(tk))


async def test_aclose_closes_a_toolkit_built_without_a_context_manager():
    tk = await create_toolkit(builtins=False, extra_tools=[Probe("x").tool])
    await tk.aclose()


# -- relay collision guard -----------------------------------------------------------------


@pytest.mark.parametrize("builtins", [True, False])
@pytest.mark.parametrize("name", ["bash", "question"])
async def test_relay_named_like_a_builtin_is_refused_at_construction(builtins, name):
    with pytest.raises(Exception, match="collides with a built-in"):
        await create_toolkit(builtins=builtins, extra_tools=[relay_tool(name, "shadow")])


@pytest.mark.parametrize("builtins", [True, False])
async def test_relay_named_like_a_builtin_is_refused_by_register(builtins):
    async with await create_toolkit(builtins=builtins) as tk:
        with pytest.raises(Exception, match="collides with a built-in"):
            tk.register(relay_tool("bash", "shadow"))
        assert tk.get("bash") is None or tk.get("bash").source != "relay"


async def test_relay_collision_is_refused_even_when_the_builtin_is_toggled_off_by_name():
    with pytest.raises(Exception, match="collides with a built-in"):
        await create_toolkit(
            builtins={"tools": {"question": False}}, extra_tools=[relay_tool("question", "shadow")]
        )


async def test_relay_with_a_fresh_name_is_accepted():
    async with await create_toolkit(builtins=True, extra_tools=[relay_tool("refund", "r")]) as tk:
        assert tk.get("refund").source == "relay"


@pytest.mark.parametrize("builtins", [True, False])
async def test_non_relay_tool_may_shadow_a_builtin(builtins):
    mine = Probe("bash", output="host bash")
    async with await create_toolkit(builtins=builtins, extra_tools=[mine.tool]) as tk:
        assert names(tk).count("bash") == 1
        assert tk.get("bash").source == "native"
        res = await tk.execute("bash", {"command": "rm -rf /"}, ToolContext())
    assert res.output == "host bash" and mine.count == 1


async def test_non_relay_tool_may_shadow_a_builtin_via_register():
    mine = Probe("question", output="host question")
    async with await create_toolkit(builtins=True) as tk:
        tk.register(mine.tool)
        res = await tk.execute("question", {"questions": [COLOR_Q]}, ToolContext())
    assert res.output == "host question" and pending_of(res) is None


# -- adapters --------------------------------------------------------------------------------


async def test_to_openai_shape_includes_relay_tools():
    schema = {"type": "object", "properties": {"amount": {"type": "integer"}}}
    async with await create_toolkit(
        builtins=False, extra_tools=[Probe("add").tool, relay_tool("refund", "Refund it", schema)]
    ) as tk:
        out = tk.to_openai()
    assert [o["type"] for o in out] == ["function", "function"]
    fns = [o["function"] for o in out]
    assert [(f["name"], f["description"], f["parameters"]) for f in fns] == [
        ("add", "the add tool", OBJ),
        ("refund", "Refund it", schema),
    ]


async def test_to_anthropic_shape_includes_relay_tools():
    async with await create_toolkit(
        builtins=False, extra_tools=[Probe("add").tool, relay_tool("refund", "Refund it")]
    ) as tk:
        out = tk.to_anthropic()
    assert [(o["name"], o["description"]) for o in out] == [
        ("add", "the add tool"),
        ("refund", "Refund it"),
    ]
    assert out[0]["input_schema"] == OBJ
    assert out[1]["input_schema"]["type"] == "object"


# -- relay tools executed directly ------------------------------------------------------------


def test_relay_tool_defaults_and_source():
    t = relay_tool("refund", "Refund it")
    assert t.source == "relay"
    assert t.input_schema["type"] == "object"


async def test_relay_tool_first_call_suspends_with_one_call_in_data_calls():
    async with await create_toolkit(builtins=False, extra_tools=[relay_tool("refund", "r")]) as tk:
        res = await tk.execute(
            "refund", {"amount": 5}, ToolContext(call_id="c1", arguments='{"amount":  5}')
        )
    req = pending_of(res)
    assert req is not None and req.kind == "tool_call"
    assert req.data["calls"] == [
        {"id": "c1", "name": "refund", "input": {"amount": 5}, "arguments": '{"amount":  5}'}
    ]


async def test_relay_tool_with_ok_answer_returns_the_host_output():
    async with await create_toolkit(builtins=False, extra_tools=[relay_tool("refund", "r")]) as tk:
        ans = Answer(id="r1", ok=True, data={"output": "refunded $5"})
        res = await tk.execute("refund", {}, ToolContext(answer=ans, call_id="c1"))
    assert (res.output, res.is_error) == ("refunded $5", False)
    assert pending_of(res) is None


async def test_relay_tool_with_declined_answer_names_tool_and_reason():
    async with await create_toolkit(builtins=False, extra_tools=[relay_tool("refund", "r")]) as tk:
        ans = Answer(id="r1", ok=False, reason="too risky")
        res = await tk.execute("refund", {}, ToolContext(answer=ans, call_id="c1"))
    assert res.is_error and res.output == "relay declined for refund: too risky"


# -- the question builtin executed directly ---------------------------------------------------


async def test_question_first_call_suspends_with_rendered_prompt_and_questions():
    qs = [COLOR_Q, {"question": "Confirm?"}]
    async with await create_toolkit(builtins=True) as tk:
        res = await tk.execute("question", {"questions": qs}, ToolContext(call_id="q1"))
    req = pending_of(res)
    assert res.is_error is True
    assert req.kind == "question"
    assert req.prompt == "Pick a color? (options: red, green)\nConfirm?"
    assert "Color" not in req.prompt
    assert req.data["questions"] == qs


async def test_question_with_ok_answer_outputs_the_answer_data_as_json():
    async with await create_toolkit(builtins=True) as tk:
        ans = Answer(id="r1", ok=True, data={"color": "red"})
        res = await tk.execute("question", {"questions": [COLOR_Q]}, ToolContext(answer=ans))
    assert pending_of(res) is None and not res.is_error
    assert json.loads(res.output) == {"color": "red"}


async def test_question_with_ok_answer_and_no_data_outputs_empty_object():
    async with await create_toolkit(builtins=True) as tk:
        res = await tk.execute(
            "question", {"questions": [COLOR_Q]}, ToolContext(answer=Answer(id="r1", ok=True))
        )
    assert json.loads(res.output) == {}
