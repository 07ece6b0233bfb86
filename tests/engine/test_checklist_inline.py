"""Checklist: the loop rule with `wait_for` (suspensions resolved inline)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.engine.helpers import (
    AMOUNT_SCHEMA,
    BACKENDS,
    OBJ,
    C,
    FakeProvider,
    Gate,
    Probe,
    assert_balanced,
    calls,
    kit,
    say,
    tool_results,
)
from toolnexus import Answer, Tool, ToolResult, create_toolkit, pending
from toolnexus.relay import answer_declined, answer_output, relay_tool

all_backends = pytest.mark.parametrize("backend", BACKENDS)


def refund_relay():
    return relay_tool("refund", "Refund the customer", AMOUNT_SCHEMA)


# -- non-relay suspension resolved inline ----------------------------------------------------


@all_backends
async def test_wait_for_gets_the_request_and_ok_reruns_the_tool_with_the_answer(backend):
    gate = Gate("login", prompt="Log in first", url="https://login.test/abc")
    seen = []

    def wait_for(req):
        seen.append(req)
        return Answer(id=req.id, ok=True, data={"token": "t0k"})

    prov = FakeProvider(backend, calls(C("c1", "login")), say("logged in"))
    async with await kit(gate) as tk:
        r = await prov.client(wait_for=wait_for).run("log me in", tk)
    assert r.status == "done" and r.text == "logged in" and r.pending is None
    assert [(q.kind, q.url) for q in seen] == [("authorization", "https://login.test/abc")]
    assert gate.done == 1 and gate.answers[0].id == seen[0].id
    assert prov.results_seen()["c1"] == 'login done with {"token": "t0k"}'
    assert r.tool_calls[0]["output"] == 'login done with {"token": "t0k"}'
    assert r.tool_calls[0]["is_error"] is False


@all_backends
async def test_async_wait_for_is_awaited(backend):
    gate = Gate("login")

    async def wait_for(req):
        return Answer(id=req.id, ok=True, data={"v": 1})

    prov = FakeProvider(backend, calls(C("c1", "login")), say("fine"))
    async with await kit(gate) as tk:
        r = await prov.client(wait_for=wait_for).run("go", tk)
    assert r.status == "done" and gate.done == 1


@all_backends
async def test_inline_request_carries_the_call_id_and_the_tools_data(backend):
    gate = Gate("login", data={"scope": "read"})
    seen = []

    def wait_for(req):
        seen.append(req)
        return Answer(id=req.id, ok=True)

    prov = FakeProvider(backend, calls(C("call_77", "login")), say("ok"))
    async with await kit(gate) as tk:
        await prov.client(wait_for=wait_for).run("go", tk)
    assert seen[0].data["callId"] == "call_77"
    assert seen[0].data["scope"] == "read"


@all_backends
async def test_context_has_call_id_and_arguments_on_first_run_and_retry(backend):
    gate = Gate("login")
    prov = FakeProvider(backend, calls(C("c1", "login", '{"user": "ada"}')), say("ok"))
    async with await kit(gate) as tk:
        await prov.client(wait_for=lambda q: Answer(id=q.id, ok=True)).run("go", tk)
    assert len(gate.runs) == 2
    for args, ctx in gate.runs:
        assert args == {"user": "ada"}
        assert ctx.call_id == "c1"
        assert json.loads(ctx.arguments) == {"user": "ada"}
    assert gate.runs[0][1].answer is None


async def test_wait_for_answer_that_does_not_echo_the_request_id_raises():
    prov = FakeProvider("openai", calls(C("c1", "login")), say("never"))
    async with await kit(Gate("login")) as tk:
        client = prov.client(wait_for=lambda q: Answer(id="someone-else", ok=True))
        with pytest.raises(Exception):  # noqa: B017 - the contract only says "raises"
            await client.run("go", tk)
    assert len(prov.bodies) == 1


@all_backends
async def test_wait_for_decline_feeds_the_reason_to_the_model_and_run_goes_on(backend):
    gate = Gate("login", prompt="Log in first")
    prov = FakeProvider(backend, calls(C("c1", "login")), say("could not log in"))
    async with await kit(gate) as tk:
        r = await prov.client(wait_for=lambda q: answer_declined(q.id, "no access today")).run(
            "go", tk
        )
    assert r.status == "done" and r.text == "could not log in"
    assert gate.done == 0
    assert prov.results_seen()["c1"] == "declined/expired: Log in first (reason: no access today)"
    assert r.tool_calls[0]["is_error"] is True


@all_backends
async def test_wait_for_decline_without_reason_defaults_to_declined(backend):
    prov = FakeProvider(backend, calls(C("c1", "login")), say("ok"))
    async with await kit(Gate("login", prompt="Log in first")) as tk:
        await prov.client(wait_for=lambda q: Answer(id=q.id, ok=False)).run("go", tk)
    assert prov.results_seen()["c1"] == "declined/expired: Log in first (reason: declined)"


@all_backends
async def test_retry_that_suspends_again_is_unresolved_not_a_loop(backend):
    runs = []

    def stubborn(args, ctx):
        runs.append(ctx.answer)
        return pending(kind="input", prompt="Still need it")

    tool = Tool(
        name="stubborn", description="s", input_schema=OBJ, source="native", execute=stubborn
    )
    asked = []

    def wait_for(q):
        asked.append(q)
        return Answer(id=q.id, ok=True)

    prov = FakeProvider(backend, calls(C("c1", "stubborn")), say("gave up"))
    async with await create_toolkit(builtins=False, extra_tools=[tool]) as tk:
        r = await prov.client(wait_for=wait_for).run("go", tk)
    assert r.status == "done"
    assert len(asked) == 1 and len(runs) == 2
    assert prov.results_seen()["c1"] == "unresolved: Still need it"


async def test_wait_for_raising_aborts_the_run():
    def wait_for(q):
        raise RuntimeError("host is down")

    prov = FakeProvider("openai", calls(C("c1", "login")), say("never"))
    async with await kit(Gate("login")) as tk:
        with pytest.raises(Exception, match="host is down"):
            await prov.client(wait_for=wait_for).run("go", tk)
    assert len(prov.bodies) == 1


@all_backends
async def test_question_builtin_answer_reaches_the_model(backend):
    q = {"question": "Pick a color?", "options": ["red", "green"]}
    seen = []

    def wait_for(req):
        seen.append(req)
        return Answer(id=req.id, ok=True, data={"color": "green"})

    prov = FakeProvider(backend, calls(C("c1", "question", {"questions": [q]})), say("green it is"))
    async with await create_toolkit(builtins=True) as tk:
        r = await prov.client(wait_for=wait_for).run("ask me", tk)
    assert r.status == "done"
    assert seen[0].kind == "question" and seen[0].prompt == "Pick a color? (options: red, green)"
    assert json.loads(prov.results_seen()["c1"]) == {"color": "green"}


# -- suspension is not a tool error --------------------------------------------------------


@all_backends
async def test_after_tool_runs_once_on_the_resolved_result_never_on_the_suspension(backend):
    after = []
    hooks = {"after_tool": lambda info: after.append(info)}
    prov = FakeProvider(backend, calls(C("c1", "login")), say("ok"))
    async with await kit(Gate("login")) as tk:
        await prov.client(wait_for=lambda q: Answer(id=q.id, ok=True), hooks=hooks).run("go", tk)
    assert len(after) == 1
    res = after[0]["result"]
    assert res.is_error is False and not (res.metadata or {}).get("pending")
    assert res.output.startswith("login done")


@all_backends
async def test_path_b_before_tool_guard_suspends_then_real_tool_runs(backend):
    add = Probe("add", output=lambda a: str(a["a"] + a["b"]))
    guard_calls, after = [], []

    def before_tool(info):
        guard_calls.append(info)
        if len(guard_calls) == 1:
            return {"result": pending(kind="approval", prompt="May I add?")}
        return None

    seen = []

    def wait_for(q):
        seen.append(q)
        return Answer(id=q.id, ok=True)

    hooks = {"before_tool": before_tool, "after_tool": lambda i: after.append(i["result"])}
    prov = FakeProvider(backend, calls(C("c1", "add", {"a": 1, "b": 2})), say("3"))
    async with await kit(add) as tk:
        r = await prov.client(wait_for=wait_for, hooks=hooks).run("add", tk)
    assert r.status == "done"
    assert [q.kind for q in seen] == ["approval"] and seen[0].data["callId"] == "c1"
    assert add.count == 1
    assert prov.results_seen()["c1"] == "3"
    assert len(after) == 1 and after[0].output == "3" and not after[0].is_error
    assert r.tool_calls[0]["is_error"] is False


# -- relay through wait_for ------------------------------------------------------------------


@all_backends
async def test_relay_call_reaches_the_host_with_stamped_id_and_raw_arguments(backend):
    raw = '{"amount": 5,  "x":1}'
    seen = []

    def wait_for(q):
        seen.append(q)
        return answer_output(q.id, "refunded $5")

    prov = FakeProvider(backend, calls(C("c1", "refund", raw)), say("done"))
    async with await create_toolkit(builtins=False, extra_tools=[refund_relay()]) as tk:
        r = await prov.client(wait_for=wait_for).run("refund", tk)
    assert r.status == "done"
    assert len(seen) == 1 and seen[0].kind == "tool_call"
    (call,) = seen[0].data["calls"]
    assert (call["id"], call["name"], call["input"]) == ("c1", "refund", {"amount": 5, "x": 1})
    if backend != "anthropic":  # anthropic sends an object, not a string
        assert call["arguments"] == raw
    assert json.loads(call["arguments"]) == {"amount": 5, "x": 1}
    assert prov.results_seen()["c1"] == "refunded $5"
    assert r.tool_calls[0]["is_error"] is False and r.tool_calls[0]["output"] == "refunded $5"


@all_backends
async def test_relay_host_failure_is_an_error_result_and_run_is_done(backend):
    prov = FakeProvider(backend, calls(C("c1", "refund", {"amount": 5})), say("sorry"))
    async with await create_toolkit(builtins=False, extra_tools=[refund_relay()]) as tk:
        r = await prov.client(
            wait_for=lambda q: answer_output(q.id, "card expired", is_error=True)
        ).run("refund", tk)
    assert r.status == "done"
    assert prov.results_seen()["c1"] == "card expired"
    assert r.tool_calls[0]["is_error"] is True
    if backend == "anthropic":
        assert tool_results(prov.last["messages"], "anthropic")[-1]["is_error"] is True


@all_backends
async def test_relay_host_decline_is_an_error_result_naming_tool_and_reason(backend):
    prov = FakeProvider(backend, calls(C("c1", "refund", {"amount": 5})), say("no refund"))
    async with await create_toolkit(builtins=False, extra_tools=[refund_relay()]) as tk:
        r = await prov.client(
            wait_for=lambda q: answer_declined(q.id, "amount exceeds refund policy")
        ).run("refund", tk)
    assert r.status == "done" and r.text == "no refund"
    assert prov.results_seen()["c1"] == "relay declined for refund: amount exceeds refund policy"
    assert r.tool_calls[0]["is_error"] is True


@all_backends
async def test_three_relay_calls_each_get_their_own_single_call_request(backend):
    seen = []

    def wait_for(q):
        seen.append(q)
        (c,) = q.data["calls"]
        return answer_output(q.id, f"{c['name']} ran")

    relays = [relay_tool(n, n) for n in ("alpha", "beta", "gamma")]
    prov = FakeProvider(
        backend,
        calls(C("c1", "alpha"), C("c2", "beta"), C("c3", "gamma")),
        say("all done"),
    )
    async with await create_toolkit(builtins=False, extra_tools=relays) as tk:
        r = await prov.client(wait_for=wait_for).run("go", tk)
    assert r.status == "done"
    assert sorted((q.data["calls"][0]["id"], q.data["calls"][0]["name"]) for q in seen) == [
        ("c1", "alpha"),
        ("c2", "beta"),
        ("c3", "gamma"),
    ]
    assert len({q.id for q in seen}) == 3
    assert prov.results_seen() == {"c1": "alpha ran", "c2": "beta ran", "c3": "gamma ran"}
    assert_balanced(r.messages, prov.shape)
    assert [t["id"] for t in r.tool_calls] == ["c1", "c2", "c3"]


@all_backends
async def test_multi_round_relay_same_tool_in_three_turns(backend):
    n = {"i": 0}

    def wait_for(q):
        n["i"] += 1
        return answer_output(q.id, f"round {n['i']}")

    prov = FakeProvider(
        backend,
        calls(C("c1", "refund", {"amount": 1})),
        calls(C("c2", "refund", {"amount": 2})),
        calls(C("c3", "refund", {"amount": 3})),
        say("three refunds"),
    )
    async with await create_toolkit(builtins=False, extra_tools=[refund_relay()]) as tk:
        r = await prov.client(wait_for=wait_for).run("go", tk)
    assert r.status == "done" and n["i"] == 3 and len(r.tool_calls) == 3
    assert r.turns == 4
    assert prov.results_seen() == {"c1": "round 1", "c2": "round 2", "c3": "round 3"}


@all_backends
async def test_real_tool_and_relay_in_one_turn_inline(backend):
    add = Probe("add", output="3")
    prov = FakeProvider(backend, calls(C("c1", "add"), C("c2", "refund", {"amount": 1})), say("ok"))
    async with await create_toolkit(builtins=False, extra_tools=[add.tool, refund_relay()]) as tk:
        r = await prov.client(wait_for=lambda q: answer_output(q.id, "refunded")).run("go", tk)
    assert r.status == "done" and add.count == 1
    assert prov.results_seen() == {"c1": "3", "c2": "refunded"}


@all_backends
async def test_after_tool_can_replace_a_resolved_relay_result(backend):
    def after_tool(info):
        if info["name"] == "refund":
            return {"result": ToolResult(output="[redacted]")}
        return None

    prov = FakeProvider(backend, calls(C("c1", "refund", {"amount": 1})), say("ok"))
    async with await create_toolkit(builtins=False, extra_tools=[refund_relay()]) as tk:
        r = await prov.client(
            wait_for=lambda q: answer_output(q.id, "card 4242"), hooks={"after_tool": after_tool}
        ).run("go", tk)
    assert prov.results_seen()["c1"] == "[redacted]"
    assert r.tool_calls[0]["output"] == "[redacted]"


@all_backends
async def test_declared_but_uncalled_relay_tool_is_inert(backend):
    async def run_with(extra):
        prov = FakeProvider(backend, say("hello"))
        async with await create_toolkit(builtins=False, extra_tools=extra) as tk:
            r = await prov.client().run("hi", tk)
        return r, prov

    r1, p1 = await run_with([Probe("add").tool])
    r2, p2 = await run_with([Probe("add").tool, refund_relay()])
    assert (r1.status, r1.text, r1.turns) == (r2.status, r2.text, r2.turns) == ("done", "hello", 1)
    assert r2.tool_calls == []
    assert r1.messages == r2.messages
    strip = [{k: v for k, v in b.items() if k != "tools"} for b in (p1.last, p2.last)]
    assert strip[0] == strip[1]


@all_backends
async def test_relay_tool_is_declared_to_the_model(backend):
    prov = FakeProvider(backend, say("hello"))
    async with await create_toolkit(builtins=False, extra_tools=[refund_relay()]) as tk:
        await prov.client().run("hi", tk)
    tools = prov.last["tools"]
    names = [t.get("function", t).get("name") for t in tools]
    assert names == ["refund"]


@all_backends
async def test_parked_wait_for_answered_from_outside_resolves_each_relay_call(backend):
    inbox: asyncio.Queue = asyncio.Queue()

    async def wait_for(q):  # park until someone outside answers
        fut = asyncio.get_running_loop().create_future()
        await inbox.put((q, fut))
        return await fut

    async def host():
        for _ in range(3):
            q, fut = await inbox.get()
            (c,) = q.data["calls"]
            fut.set_result(answer_output(q.id, f"{c['name']}@host"))

    relays = [relay_tool(n, n) for n in ("alpha", "beta", "gamma")]
    prov = FakeProvider(
        backend, calls(C("c1", "alpha"), C("c2", "beta"), C("c3", "gamma")), say("parked and done")
    )
    async with await create_toolkit(builtins=False, extra_tools=relays) as tk:
        host_task = asyncio.create_task(host())
        r = await asyncio.wait_for(prov.client(wait_for=wait_for).run("go", tk), 5)
        await host_task
    assert r.status == "done" and len(r.tool_calls) == 3
    assert prov.results_seen() == {"c1": "alpha@host", "c2": "beta@host", "c3": "gamma@host"}
    assert_balanced(r.messages, prov.shape)


# -- HALT: wait_for leaves a suspension to halt the run ----------------------------------


@all_backends
async def test_wait_for_returning_halt_halts_on_that_call_and_settles_the_others(backend):
    from toolnexus import HALT

    seen = []

    def wait_for(req):
        seen.append(req)
        amount = json.loads(req.data["calls"][0]["arguments"])["amount"]
        return answer_output(req.id, "refunded") if amount < 50 else HALT

    prov = FakeProvider(
        backend,
        calls(C("small", "refund", {"amount": 5}), C("big", "refund", {"amount": 500})),
        say("done"),
    )
    async with await kit(refund_relay()) as tk:
        r = await prov.client(wait_for=wait_for).run("refund both", tk)
    assert len(seen) == 2
    assert r.status == "pending" and r.pending is not None
    assert [c["id"] for c in r.pending.data["calls"]] == ["big"]
    small = next(t for t in r.tool_calls if t["id"] == "small")
    assert small["output"] == "refunded" and small["is_error"] is False
