"""Checklist: the durable halt (no `wait_for`): status pending, first-in-order halt, what
the transcript holds at the halt, relay requests and their call data."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.engine.helpers import (
    BACKENDS,
    C,
    FakeProvider,
    Gate,
    Probe,
    calls,
    kit,
    result_ids,
    result_map,
    tool_call_ids,
    tool_results,
)
from toolnexus import Request, create_toolkit
from toolnexus.relay import relay_calls_of, relay_tool

all_backends = pytest.mark.parametrize("backend", BACKENDS)


async def run_once(backend, *script, tools=(), builtins=False, **opts):
    prov = FakeProvider(backend, *script)
    async with await create_toolkit(
        builtins=builtins, extra_tools=[getattr(t, "tool", t) for t in tools]
    ) as tk:
        r = await asyncio.wait_for(prov.client(**opts).run("go", tk), 5)
    return r, prov


@all_backends
async def test_no_wait_for_halts_with_pending_authorization_and_login_url(backend):
    gate = Gate("login", prompt="Log in first", url="https://login.test/abc")
    r, prov = await run_once(backend, calls(C("c1", "login")), tools=[gate])
    assert r.status == "pending"
    assert isinstance(r.pending, Request)
    assert (r.pending.kind, r.pending.url, r.pending.prompt) == (
        "authorization",
        "https://login.test/abc",
        "Log in first",
    )
    assert r.text == "Log in first"
    assert r.limit is None
    assert len(prov.bodies) == 1  # nothing is sent to the model after a halt


@all_backends
async def test_halt_stamps_the_provider_call_id_into_data(backend):
    gate = Gate("login", data={"scope": "read"})
    r, _ = await run_once(backend, calls(C("toolu_9", "login")), tools=[gate])
    assert r.pending.data["callId"] == "toolu_9"
    assert r.pending.data["scope"] == "read"


@all_backends
async def test_placeholder_content_is_the_request_prompt_only(backend):
    gate = Gate("login", prompt="Log in first", url="https://login.test/abc")
    r, prov = await run_once(backend, calls(C("c1", "login")), tools=[gate])
    assert result_map(r.messages, prov.shape) == {"c1": "Log in first"}


@all_backends
async def test_question_builtin_halts_with_kind_question_and_rendered_prompt(backend):
    q = {"question": "Pick a color?", "header": "Color", "options": ["red", "green"]}
    r, _ = await run_once(backend, calls(C("c1", "question", {"questions": [q]})), builtins=True)
    assert r.status == "pending"
    assert r.pending.kind == "question"
    assert r.pending.prompt == "Pick a color? (options: red, green)"
    assert r.pending.data["questions"] == [q]


@all_backends
async def test_two_suspensions_halt_on_the_first_in_call_order(backend):
    first = Gate("first", prompt="First?")
    second = Gate("second", prompt="Second?")
    r, prov = await run_once(
        backend, calls(C("c1", "first"), C("c2", "second")), tools=[first, second]
    )
    assert r.status == "pending" and r.pending.prompt == "First?"
    assert r.pending.data["callId"] == "c1"
    assert result_ids(r.messages, prov.shape) == ["c1"]
    assert "c2" not in json.dumps([m for m in r.messages if m.get("role") != "assistant"])


@all_backends
async def test_halt_order_holds_when_the_second_suspension_finishes_first(backend):
    async def slow(args, ctx):
        await asyncio.sleep(0.05)
        return await Gate("slow", prompt="Slow?").execute(args, ctx)

    from toolnexus import Tool

    slow_tool = Tool(
        name="slow", description="s", input_schema={"type": "object"}, source="native", execute=slow
    )
    r, _ = await run_once(
        backend,
        calls(C("c1", "slow"), C("c2", "fast")),
        tools=[slow_tool, Gate("fast", prompt="Fast?")],
    )
    assert r.pending.prompt == "Slow?" and r.pending.data["callId"] == "c1"


async def test_anthropic_halt_last_user_message_holds_t1_not_t2():
    r, _ = await run_once(
        "anthropic",
        calls(C("t1", "first"), C("t2", "second")),
        tools=[Gate("first"), Gate("second")],
    )
    last = r.messages[-1]
    assert last["role"] == "user"
    ids = [b["tool_use_id"] for b in last["content"] if b.get("type") == "tool_result"]
    assert ids == ["t1"]


@all_backends
async def test_halt_keeps_results_of_completed_calls_before_and_after_the_halted_one(backend):
    before = Probe("before", output="B-result")
    after = Probe("after", output="A-result")
    r, prov = await run_once(
        backend,
        calls(C("c1", "before"), C("c2", "gate"), C("c3", "after"), C("c4", "gate2")),
        tools=[before, Gate("gate", prompt="Gate?"), after, Gate("gate2", prompt="Gate2?")],
    )
    assert r.pending.prompt == "Gate?"
    assert [(t["id"], t["content"]) for t in _results(r, prov)] == [
        ("c1", "B-result"),
        ("c2", "Gate?"),
        ("c3", "A-result"),
    ]
    assert before.count == 1 and after.count == 1


def _results(r, prov):
    return tool_results(r.messages, prov.shape)


@all_backends
async def test_halt_transcript_ends_with_the_halted_turn_and_is_json_serialisable(backend):
    r, prov = await run_once(
        backend,
        calls(C("c1", "login"), text="checking"),
        tools=[Gate("login")],
        system_prompt="Be brief",
    )
    assert json.loads(json.dumps(r.messages)) == r.messages
    assert tool_call_ids(r.messages, prov.shape) == ["c1"]
    roles = [m["role"] for m in r.messages]
    assert roles[-2:] == (
        ["assistant", "tool"] if prov.shape == "openai" else ["assistant", "user"]
    )


@all_backends
async def test_halt_reports_turns_and_usage_of_the_run(backend):
    r, _ = await run_once(backend, calls(C("c1", "login"), usage=(11, 4)), tools=[Gate("login")])
    assert r.turns == 1
    assert r.usage == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    assert r.model == "test-model"


# -- relay at a halt -------------------------------------------------------------------------


def relays(*names):
    return [relay_tool(n, f"the {n} relay") for n in names]


@all_backends
async def test_three_relay_calls_ride_one_pending_request_in_order(backend):
    r, _ = await run_once(
        backend,
        calls(C("c1", "alpha", {"n": 1}), C("c2", "beta", {"n": 2}), C("c3", "gamma", {"n": 3})),
        tools=relays("alpha", "beta", "gamma"),
    )
    assert r.status == "pending" and r.pending.kind == "tool_call"
    got = [(c.id, c.name, c.input) for c in relay_calls_of(r.pending)]
    assert got == [("c1", "alpha", {"n": 1}), ("c2", "beta", {"n": 2}), ("c3", "gamma", {"n": 3})]
    assert isinstance(r.pending.data["calls"], list)


async def test_relay_call_order_is_deterministic_over_20_runs():
    for _ in range(20):
        r, _ = await run_once(
            "openai",
            calls(C("c1", "alpha"), C("c2", "beta"), C("c3", "gamma")),
            tools=relays("alpha", "beta", "gamma"),
        )
        assert [(c.id, c.name) for c in relay_calls_of(r.pending)] == [
            ("c1", "alpha"),
            ("c2", "beta"),
            ("c3", "gamma"),
        ]


@pytest.mark.parametrize("backend", ["openai", "inprocess"])
async def test_relay_data_calls_keep_the_raw_arguments_byte_for_byte(backend):
    raw = '{"amount": 5,  "x":1}'
    r, _ = await run_once(backend, calls(C("c1", "refund", raw)), tools=relays("refund"))
    (call,) = r.pending.data["calls"]
    assert call == {"id": "c1", "name": "refund", "input": {"amount": 5, "x": 1}, "arguments": raw}


async def test_anthropic_relay_call_id_comes_from_tool_use_and_arguments_encode_input():
    r, _ = await run_once(
        "anthropic", calls(C("toolu_1", "refund", {"amount": 5})), tools=relays("refund")
    )
    (call,) = relay_calls_of(r.pending)
    assert call.id == "toolu_1" and call.input == {"amount": 5}
    assert json.loads(call.arguments) == {"amount": 5}


@all_backends
async def test_relay_halt_transcript_holds_completed_results_and_first_relay_placeholder(backend):
    add = Probe("add", output="3")
    r, prov = await run_once(
        backend,
        calls(C("c1", "alpha"), C("c2", "add"), C("c3", "gamma")),
        tools=[*relays("alpha", "gamma"), add],
    )
    assert [c.id for c in relay_calls_of(r.pending)] == ["c1", "c3"]
    m = result_map(r.messages, prov.shape)
    assert list(m) == ["c1", "c2"]
    assert m["c1"] == r.pending.prompt and m["c2"] == "3"
    assert add.count == 1


@all_backends
async def test_relay_and_auth_in_one_turn_auth_first_surfaces_clean_authorization(backend):
    r, _ = await run_once(
        backend,
        calls(C("c1", "login"), C("c2", "refund", {"amount": 1})),
        tools=[Gate("login", url="https://login.test"), *relays("refund")],
    )
    assert r.pending.kind == "authorization"
    assert relay_calls_of(r.pending) == []
    assert "calls" not in (r.pending.data or {})


@all_backends
async def test_real_tool_runs_alongside_a_halting_relay(backend):
    add = Probe("add", output="3")
    r, prov = await run_once(
        backend, calls(C("c1", "add"), C("c2", "refund")), tools=[add, *relays("refund")]
    )
    assert r.status == "pending" and add.count == 1
    assert result_map(r.messages, prov.shape)["c1"] == "3"
    assert [c.id for c in relay_calls_of(r.pending)] == ["c2"]


@all_backends
async def test_past_expires_at_is_carried_on_the_surfaced_request(backend):
    gate = Gate("login", expires_at="2000-01-01T00:00:00Z")
    r, _ = await run_once(backend, calls(C("c1", "login")), tools=[gate])
    assert r.status == "pending"
    assert r.pending.to_dict()["expiresAt"] == "2000-01-01T00:00:00Z"


@all_backends
async def test_max_turns_exhausted_is_incomplete_even_with_text(backend):
    add = Probe("add", output="3")
    prov = FakeProvider(backend, default=calls(C("c1", "add"), text="still working"))
    async with await kit(add) as tk:
        r = await prov.client(max_turns=2).run("loop", tk)
    assert r.status == "incomplete" and r.limit == "maxTurns"
    assert r.pending is None
    assert r.turns == 2 and len(prov.bodies) == 2


@all_backends
async def test_max_turns_exhausted_without_text_is_incomplete(backend):
    prov = FakeProvider(backend, default=calls(C("c1", "add")))
    async with await kit(Probe("add")) as tk:
        r = await prov.client(max_turns=1).run("loop", tk)
    assert (r.status, r.limit) == ("incomplete", "maxTurns")
