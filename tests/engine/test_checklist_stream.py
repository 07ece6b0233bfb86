"""Checklist: streaming (`stream` / `stream_with_answer`) on every client style."""

from __future__ import annotations

import asyncio

import pytest

from tests.engine.helpers import (
    ADD_SCHEMA,
    BACKENDS,
    C,
    FakeProvider,
    Gate,
    Probe,
    assert_balanced,
    calls,
    collect,
    kit,
    result_ids,
    say,
    types_of,
)
from toolnexus import Answer, Request, RunCancelled, RunResult, create_toolkit
from toolnexus.relay import RelayResult, relay_answer, relay_calls_of, relay_tool

all_backends = pytest.mark.parametrize("backend", BACKENDS)


def adder():
    return Probe("add", output=lambda a: str(a["a"] + a["b"]), schema=ADD_SCHEMA)


def of_type(events, t):
    return [e for e in events if e["type"] == t]


@all_backends
async def test_stream_events_come_in_loop_order(backend):
    prov = FakeProvider(
        backend,
        calls(
            C("c1", "add", {"a": 1, "b": 2}), C("c2", "add", {"a": 3, "b": 4}), text="Let me add."
        ),
        say("The sums are 3 and 7"),
    )
    async with await kit(adder()) as tk:
        events = await collect(prov.client().stream("add", tk))
    kinds = types_of(events)
    assert kinds[-1] == "done" and kinds.count("done") == 1
    core = [(e["type"], e.get("id")) for e in events if e["type"] in ("tool_call", "tool_result")]
    assert core == [
        ("tool_call", "c1"),
        ("tool_call", "c2"),
        ("tool_result", "c1"),
        ("tool_result", "c2"),
    ]
    assert "".join(e["delta"] for e in of_type(events, "text")) == "Let me add.The sums are 3 and 7"
    first_call = kinds.index("tool_call")
    last_result = len(kinds) - 1 - kinds[::-1].index("tool_result")
    assert kinds.index("text") < first_call
    assert max(i for i, k in enumerate(kinds) if k == "text") > last_result
    assert "usage" in kinds and kinds.index("usage") < kinds.index("done")
    tc = of_type(events, "tool_call")
    assert [(e["name"], e["args"]) for e in tc] == [
        ("add", {"a": 1, "b": 2}),
        ("add", {"a": 3, "b": 4}),
    ]
    tr = of_type(events, "tool_result")
    assert [(e["name"], e["output"], e["is_error"]) for e in tr] == [
        ("add", "3", False),
        ("add", "7", False),
    ]


@all_backends
async def test_stream_done_carries_the_run_result(backend):
    prov = FakeProvider(
        backend, calls(C("c1", "add", {"a": 1, "b": 2}), usage=(4, 1)), say("3", usage=(6, 2))
    )
    async with await kit(adder()) as tk:
        events = await collect(prov.client().stream("add", tk))
    result = events[-1]["result"]
    assert isinstance(result, RunResult)
    assert (result.status, result.text, result.turns) == ("done", "3", 2)
    assert result.usage == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    assert_balanced(result.messages, prov.shape)
    assert prov.results_seen() == {"c1": "3"}


@all_backends
async def test_stream_halt_emits_pending_then_done_pending_with_the_first_request(backend):
    prov = FakeProvider(backend, calls(C("c1", "first"), C("c2", "second")))
    async with await kit(Gate("first", prompt="First?"), Gate("second", prompt="Second?")) as tk:
        events = await asyncio.wait_for(collect(prov.client().stream("go", tk)), 5)
    kinds = types_of(events)
    assert kinds[-1] == "done"
    pend = of_type(events, "pending")
    assert len(pend) == 1 and isinstance(pend[0]["request"], Request)
    assert pend[0]["request"].prompt == "First?"
    assert kinds.index("pending") < kinds.index("done")
    result = events[-1]["result"]
    assert result.status == "pending" and result.pending.id == pend[0]["request"].id
    assert result.pending.data["callId"] == "c1"
    assert not [e for e in of_type(events, "tool_result") if e["id"] == "c2"]
    assert result_ids(result.messages, prov.shape) == ["c1"]
    assert len(prov.bodies) == 1


@all_backends
async def test_stream_pending_event_reaches_the_consumer_while_wait_for_is_parked(backend):
    seen_pending = asyncio.Event()
    asked = []

    async def wait_for(q):  # a host that parks until the link has been pushed
        asked.append(q)
        await asyncio.wait_for(seen_pending.wait(), 1)
        return Answer(id=q.id, ok=True)

    events = []
    prov = FakeProvider(backend, calls(C("c1", "login")), say("in"))
    async with await kit(Gate("login", url="https://login.test")) as tk:
        async for ev in prov.client(wait_for=wait_for).stream("go", tk):
            events.append(ev)
            if ev["type"] == "pending":
                assert ev["request"].url == "https://login.test"
                seen_pending.set()
    (pend,) = of_type(events, "pending")
    assert asked[0].id == pend["request"].id
    assert events[-1]["result"].status == "done"


@all_backends
async def test_stream_relay_inline_emits_pending_with_stamped_id(backend):
    prov = FakeProvider(backend, calls(C("c1", "refund", {"amount": 5})), say("refunded"))
    async with await create_toolkit(builtins=False, extra_tools=[relay_tool("refund", "r")]) as tk:
        events = await collect(
            prov.client(
                wait_for=lambda q: Answer(id=q.id, ok=True, data={"output": "done $5"})
            ).stream("go", tk)
        )
    (pend,) = of_type(events, "pending")
    assert pend["request"].kind == "tool_call"
    assert [c.id for c in relay_calls_of(pend["request"])] == ["c1"]
    result = events[-1]["result"]
    assert result.status == "done" and result.tool_calls[0]["output"] == "done $5"
    assert prov.results_seen() == {"c1": "done $5"}


@pytest.mark.parametrize("backend", ["openai", "inprocess"])
async def test_stream_relay_halt_keeps_raw_arguments_byte_for_byte(backend):
    raw = '{"amount": 5,  "x":1}'
    prov = FakeProvider(backend, calls(C("c1", "refund", raw)))
    async with await create_toolkit(builtins=False, extra_tools=[relay_tool("refund", "r")]) as tk:
        events = await collect(prov.client().stream("go", tk))
    (call,) = events[-1]["result"].pending.data["calls"]
    assert call["arguments"] == raw and call["input"] == {"amount": 5, "x": 1}


@all_backends
async def test_stream_with_answer_resumes_a_relay_halt_to_done(backend):
    relays = [relay_tool(n, n) for n in ("alpha", "beta")]
    prov = FakeProvider(backend, calls(C("c1", "alpha"), C("c2", "beta")), say("both back"))
    async with await create_toolkit(builtins=False, extra_tools=relays) as tk:
        client = prov.client()
        first = await collect(client.stream("go", tk))
        halted = first[-1]["result"]
        assert halted.status == "pending"
        ans = relay_answer(halted.pending.id, [RelayResult("c1", "A"), RelayResult("c2", "B")])
        events = await collect(client.stream_with_answer(tk, halted.messages, halted.pending, ans))
    assert types_of(events)[-1] == "done"
    result = events[-1]["result"]
    assert (result.status, result.text) == ("done", "both back")
    assert prov.results_seen() == {"c1": "A", "c2": "B"}
    assert_balanced(result.messages, prov.shape)
    assert "".join(e["delta"] for e in of_type(events, "text")) == "both back"


@all_backends
async def test_stream_with_answer_can_halt_again(backend):
    prov = FakeProvider(backend, calls(C("c1", "first"), C("c2", "second")), say("ok"))
    async with await kit(Gate("first", prompt="First?"), Gate("second", prompt="Second?")) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        events = await collect(
            client.stream_with_answer(
                tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True)
            )
        )
        (pend,) = of_type(events, "pending")
        assert pend["request"].prompt == "Second?"
        r2 = events[-1]["result"]
        assert r2.status == "pending" and r2.pending.id == pend["request"].id
        events = await collect(
            client.stream_with_answer(
                tk, r2.messages, r2.pending, Answer(id=r2.pending.id, ok=True)
            )
        )
    assert events[-1]["result"].status == "done"
    assert_balanced(events[-1]["result"].messages, prov.shape)


@all_backends
async def test_stream_with_answer_refuses_a_mismatched_id(backend):
    prov = FakeProvider(backend, calls(C("c1", "login")))
    async with await kit(Gate("login")) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        with pytest.raises(ValueError, match="does not echo"):
            await collect(
                client.stream_with_answer(tk, r1.messages, r1.pending, Answer(id="nope", ok=True))
            )
    assert len(prov.bodies) == 1


@all_backends
async def test_stream_max_turns_ends_incomplete(backend):
    prov = FakeProvider(backend, default=calls(C("c1", "add", {"a": 1, "b": 1}), text="more"))
    async with await kit(adder()) as tk:
        events = await collect(prov.client(max_turns=2).stream("go", tk))
    result = events[-1]["result"]
    assert (result.status, result.limit) == ("incomplete", "maxTurns")


@all_backends
async def test_stream_raises_run_cancelled_when_cancel_is_set(backend):
    cancel = asyncio.Event()
    cancel.set()
    prov = FakeProvider(backend, say("never"))
    async with await kit(adder()) as tk:
        with pytest.raises(RunCancelled):
            await collect(prov.client().stream("go", tk, cancel=cancel))
