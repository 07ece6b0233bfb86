"""Checklist: durable resume with `run_with_answer` (relay and non-relay suspensions)."""

from __future__ import annotations

import json

import pytest

from tests.engine.helpers import (
    BACKENDS,
    C,
    FakeProvider,
    Gate,
    Probe,
    assert_balanced,
    calls,
    kit,
    result_map,
    say,
    tool_call_ids,
    tool_results,
    user_turns,
)
from toolnexus import Answer, Request, ResumeError, create_toolkit
from toolnexus.relay import (
    RelayResult,
    answer_declined,
    answer_output,
    relay_answer,
    relay_calls_of,
    relay_tool,
)

all_backends = pytest.mark.parametrize("backend", BACKENDS)


def relays(*names):
    return [relay_tool(n, f"the {n} relay") for n in names]


def tools_of(*items):
    return [getattr(t, "tool", t) for t in items]


THREE = calls(C("c1", "alpha", {"n": 1}), C("c2", "beta", {"n": 2}), C("c3", "gamma", {"n": 3}))


# -- relay resume ----------------------------------------------------------------------------


@all_backends
async def test_relay_resume_fills_every_slot_and_finishes(backend):
    prov = FakeProvider(backend, THREE, say("all three done", usage=(7, 4)))
    async with await create_toolkit(
        builtins=False, extra_tools=relays("alpha", "beta", "gamma")
    ) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        placeholder = r1.pending.prompt
        ans = relay_answer(
            r1.pending.id, [RelayResult(c.id, f"out-{c.name}") for c in relay_calls_of(r1.pending)]
        )
        r2 = await client.run_with_answer(tk, r1.messages, r1.pending, ans)
    assert r2.status == "done" and r2.text == "all three done" and r2.pending is None
    assert_balanced(r2.messages, prov.shape)
    assert (
        len(tool_call_ids(r2.messages, prov.shape))
        == len(tool_results(r2.messages, prov.shape))
        == 3
    )
    assert prov.results_seen() == {"c1": "out-alpha", "c2": "out-beta", "c3": "out-gamma"}
    assert placeholder not in json.dumps(prov.last["messages"])
    assert user_turns(prov.last["messages"], prov.shape) == 1  # no new user turn
    assert r2.turns == 1
    assert r2.usage == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}


@all_backends
async def test_relay_shorthand_fills_the_first_relay_slot_not_slot_zero(backend):
    add = Probe("add", output="3")
    prov = FakeProvider(backend, calls(C("c1", "add"), C("c2", "refund")), say("ok"))
    async with await create_toolkit(
        builtins=False, extra_tools=[add.tool, *relays("refund")]
    ) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, answer_output(r1.pending.id, "refunded")
        )
    assert r2.status == "done"
    assert prov.results_seen() == {"c1": "3", "c2": "refunded"}
    assert add.count == 1


@all_backends
async def test_relay_shorthand_with_two_relays_leaves_the_second_unanswered(backend):
    prov = FakeProvider(backend, calls(C("c1", "alpha"), C("c2", "beta")), say("ok"))
    async with await create_toolkit(builtins=False, extra_tools=relays("alpha", "beta")) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, answer_output(r1.pending.id, "A")
        )
    assert prov.results_seen() == {"c1": "A", "c2": "no result supplied on resume for beta"}
    assert_balanced(r2.messages, prov.shape)


@all_backends
async def test_relay_resume_shorthand_is_error_flag_marks_the_result(backend):
    prov = FakeProvider(backend, calls(C("c1", "refund")), say("ok"))
    async with await create_toolkit(builtins=False, extra_tools=relays("refund")) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, answer_output(r1.pending.id, "card expired", is_error=True)
        )
    assert prov.results_seen()["c1"] == "card expired"
    assert r2.tool_calls[0]["is_error"] is True
    if backend == "anthropic":
        assert tool_results(prov.last["messages"], "anthropic")[-1]["is_error"] is True


@all_backends
async def test_relay_partial_results_leave_a_no_result_error_in_the_missing_slot(backend):
    prov = FakeProvider(backend, THREE, say("partial"))
    async with await create_toolkit(
        builtins=False, extra_tools=relays("alpha", "beta", "gamma")
    ) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        ans = relay_answer(r1.pending.id, [RelayResult("c1", "A"), RelayResult("c3", "G")])
        r2 = await client.run_with_answer(tk, r1.messages, r1.pending, ans)
    assert r2.status == "done"
    assert prov.results_seen() == {
        "c1": "A",
        "c2": "no result supplied on resume for beta",
        "c3": "G",
    }
    assert_balanced(r2.messages, prov.shape)


@all_backends
async def test_relay_decline_on_resume_gives_every_relay_slot_the_decline_text(backend):
    add = Probe("add", output="3")
    prov = FakeProvider(
        backend, calls(C("c1", "alpha"), C("c2", "add"), C("c3", "beta")), say("understood")
    )
    async with await create_toolkit(
        builtins=False, extra_tools=[*relays("alpha", "beta"), add.tool]
    ) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk,
            r1.messages,
            r1.pending,
            answer_declined(r1.pending.id, "amount exceeds refund policy"),
        )
    assert r2.status == "done" and r2.text == "understood"
    assert prov.results_seen() == {
        "c1": "relay declined for alpha: amount exceeds refund policy",
        "c2": "3",
        "c3": "relay declined for beta: amount exceeds refund policy",
    }
    assert add.count == 1
    assert_balanced(r2.messages, prov.shape)


@all_backends
async def test_relay_decline_on_resume_defaults_the_reason(backend):
    prov = FakeProvider(backend, calls(C("c1", "refund")), say("ok"))
    async with await create_toolkit(builtins=False, extra_tools=relays("refund")) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=False)
        )
    assert prov.results_seen()["c1"] == "relay declined for refund: declined"


async def test_relay_decline_on_resume_is_an_error_block_on_anthropic():
    prov = FakeProvider("anthropic", calls(C("t1", "refund")), say("ok"))
    async with await create_toolkit(builtins=False, extra_tools=relays("refund")) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, answer_declined(r1.pending.id, "no")
        )
    (block,) = tool_results(prov.last["messages"], "anthropic")
    assert block["is_error"] is True and r2.tool_calls[0]["is_error"] is True


async def test_anthropic_resume_balances_tool_use_and_tool_result():
    prov = FakeProvider("anthropic", THREE, say("done"))
    async with await create_toolkit(
        builtins=False, extra_tools=relays("alpha", "beta", "gamma")
    ) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        ans = relay_answer(r1.pending.id, [RelayResult(c, c.upper()) for c in ("c1", "c2", "c3")])
        r2 = await client.run_with_answer(tk, r1.messages, r1.pending, ans)
    body = json.dumps(r2.messages)
    assert body.count('"tool_use"') == body.count('"tool_result"') == 3
    sent = prov.last["messages"]
    assert [m["role"] for m in sent[-2:]] == ["assistant", "user"]
    assert [b["tool_use_id"] for b in sent[-1]["content"]] == ["c1", "c2", "c3"]


# -- non-relay resume ------------------------------------------------------------------------


@all_backends
async def test_non_relay_resume_re_executes_the_tool_with_the_answer(backend):
    gate = Gate("login", prompt="Log in first", url="https://login.test")
    prov = FakeProvider(backend, calls(C("c1", "login", {"user": "ada"})), say("welcome"))
    async with await kit(gate) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        ans = Answer(id=r1.pending.id, ok=True, data={"token": "t"})
        r2 = await client.run_with_answer(tk, r1.messages, r1.pending, ans)
    assert r2.status == "done" and r2.text == "welcome"
    assert gate.done == 1 and gate.answers[0].id == r1.pending.id
    args, ctx = gate.runs[-1]
    assert args == {"user": "ada"} and ctx.call_id == "c1"
    assert prov.results_seen() == {"c1": 'login done with {"token": "t"}'}
    assert_balanced(r2.messages, prov.shape)
    assert "Log in first" not in json.dumps(prov.last["messages"])


@all_backends
async def test_non_relay_decline_on_resume_carries_prompt_and_reason(backend):
    gate = Gate("refund", kind="approval", prompt="Refund $5?")
    prov = FakeProvider(backend, calls(C("c1", "refund")), say("no refund"))
    async with await kit(gate) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk,
            r1.messages,
            r1.pending,
            answer_declined(r1.pending.id, "amount exceeds refund policy"),
        )
    assert r2.status == "done" and r2.text == "no refund"
    assert gate.done == 0
    assert prov.results_seen()["c1"] == (
        "declined/expired: Refund $5? (reason: amount exceeds refund policy)"
    )
    assert r2.tool_calls[0]["is_error"] is True


@all_backends
async def test_expired_request_closed_out_on_resume(backend):
    gate = Gate("login", prompt="Log in first", expires_at="2000-01-01T00:00:00Z")
    prov = FakeProvider(backend, calls(C("c1", "login")), say("expired"))
    async with await kit(gate) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, answer_declined(r1.pending.id, "expired")
        )
    assert r2.status == "done" and gate.done == 0
    assert prov.results_seen()["c1"] == "declined/expired: Log in first (reason: expired)"


@all_backends
async def test_results_recorded_at_the_halt_are_kept_and_never_rerun(backend):
    before, after = Probe("before", output="B"), Probe("after", output="A")
    gate = Gate("gate", prompt="Gate?")
    prov = FakeProvider(
        backend, calls(C("c1", "before"), C("c2", "gate"), C("c3", "after")), say("done")
    )
    async with await kit(before, gate, after) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True)
        )
    assert r2.status == "done"
    assert before.count == 1 and after.count == 1 and gate.done == 1
    assert prov.results_seen() == {"c1": "B", "c2": "gate done with {}", "c3": "A"}
    assert [t["id"] for t in tool_results(r2.messages, prov.shape)] == ["c1", "c2", "c3"]


@all_backends
async def test_two_non_relay_suspensions_are_answered_one_after_the_other(backend):
    first, second = Gate("first", prompt="First?"), Gate("second", prompt="Second?")
    prov = FakeProvider(backend, calls(C("c1", "first"), C("c2", "second")), say("both done"))
    async with await kit(first, second) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True)
        )
        assert r2.status == "pending" and len(prov.bodies) == 1
        assert r2.pending.prompt == "Second?" and r2.pending.data["callId"] == "c2"
        assert r2.pending.id != r1.pending.id
        m = result_map(r2.messages, prov.shape)
        assert m == {"c1": "first done with {}", "c2": "Second?"}
        r3 = await client.run_with_answer(
            tk, r2.messages, r2.pending, Answer(id=r2.pending.id, ok=True)
        )
    assert r3.status == "done" and r3.text == "both done"
    assert first.done == 1 and second.done == 1
    assert prov.results_seen() == {"c1": "first done with {}", "c2": "second done with {}"}
    assert_balanced(r3.messages, prov.shape)


@all_backends
async def test_auth_first_then_relay_halts_again_on_the_relay_after_resume(backend):
    gate = Gate("login", prompt="Log in")
    prov = FakeProvider(
        backend,
        calls(C("c1", "login"), C("c2", "refund", {"amount": 1})),
        say("refunded after login"),
    )
    async with await create_toolkit(
        builtins=False, extra_tools=[gate.tool, *relays("refund")]
    ) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        assert r1.pending.kind == "authorization"
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True)
        )
        assert r2.status == "pending" and r2.pending.kind == "tool_call"
        assert [(c.id, c.input) for c in relay_calls_of(r2.pending)] == [("c2", {"amount": 1})]
        r3 = await client.run_with_answer(
            tk, r2.messages, r2.pending, answer_output(r2.pending.id, "refunded")
        )
    assert r3.status == "done" and gate.done == 1
    assert prov.results_seen() == {"c1": "login done with {}", "c2": "refunded"}


@all_backends
async def test_relay_first_then_auth_halts_again_on_the_auth_after_resume(backend):
    gate = Gate("login", prompt="Log in")
    prov = FakeProvider(backend, calls(C("c1", "refund"), C("c2", "login")), say("ok"))
    async with await create_toolkit(
        builtins=False, extra_tools=[gate.tool, *relays("refund")]
    ) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        assert r1.pending.kind == "tool_call"
        assert [c.id for c in relay_calls_of(r1.pending)] == ["c1"]
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, answer_output(r1.pending.id, "refunded")
        )
        assert r2.status == "pending" and r2.pending.kind == "authorization"
        assert r2.pending.data["callId"] == "c2"
        r3 = await client.run_with_answer(
            tk, r2.messages, r2.pending, Answer(id=r2.pending.id, ok=True)
        )
    assert r3.status == "done"
    assert prov.results_seen() == {"c1": "refunded", "c2": "login done with {}"}


@all_backends
async def test_resume_continues_the_loop_through_further_tool_turns(backend):
    add = Probe("add", output="3")
    prov = FakeProvider(backend, calls(C("c1", "login")), calls(C("c2", "add")), say("3 it is"))
    async with await kit(Gate("login"), add) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True)
        )
    assert r2.status == "done" and r2.text == "3 it is" and add.count == 1
    assert r2.turns == 2
    assert_balanced(r2.messages, prov.shape)


@all_backends
async def test_resume_can_run_out_of_turns(backend):
    prov = FakeProvider(backend, calls(C("c1", "login")), default=calls(C("cx", "add")))
    async with await kit(Gate("login"), Probe("add")) as tk:
        client = prov.client(max_turns=2)
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True)
        )
    assert (r2.status, r2.limit) == ("incomplete", "maxTurns")


# -- resume errors ---------------------------------------------------------------------------


@all_backends
async def test_answer_that_does_not_echo_the_pending_id_is_refused_without_a_model_call(backend):
    prov = FakeProvider(backend, calls(C("c1", "refund")))
    async with await create_toolkit(builtins=False, extra_tools=relays("refund")) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        with pytest.raises(ResumeError, match="does not echo"):
            await client.run_with_answer(
                tk, r1.messages, r1.pending, answer_output("not-" + r1.pending.id, "x")
            )
    assert len(prov.bodies) == 1


async def test_resume_with_an_empty_transcript_is_an_error():
    prov = FakeProvider("openai")
    pend = Request(id="r1", kind="tool_call", prompt="p")
    async with await create_toolkit(builtins=False, extra_tools=relays("refund")) as tk:
        with pytest.raises(ResumeError):
            await prov.client().run_with_answer(tk, [], pend, answer_output("r1", "x"))
    assert prov.bodies == []


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
async def test_resume_without_a_halted_assistant_turn_is_an_error(backend):
    prov = FakeProvider(backend)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    pend = Request(id="r1", kind="approval", prompt="p", data={"callId": "c1"})
    async with await kit(Gate("login")) as tk:
        with pytest.raises(ResumeError):
            await prov.client().run_with_answer(tk, msgs, pend, Answer(id="r1", ok=True))
    assert prov.bodies == []


# -- across processes ------------------------------------------------------------------------


@all_backends
async def test_relay_resume_across_a_json_round_trip_with_a_new_client_and_toolkit(backend):
    prov1 = FakeProvider(backend, THREE)
    async with await create_toolkit(
        builtins=False, extra_tools=relays("alpha", "beta", "gamma")
    ) as tk:
        r1 = await prov1.client(system_prompt="Be brief").run("go", tk)
    ans = relay_answer(
        r1.pending.id, [RelayResult(c.id, f"{c.name}!") for c in relay_calls_of(r1.pending)]
    )
    stored = json.dumps(
        {"messages": r1.messages, "pending": r1.pending.to_dict(), "answer": ans.to_dict()}
    )

    loaded = json.loads(stored)
    pend = Request.from_dict(loaded["pending"])
    assert [(c.id, c.name) for c in relay_calls_of(pend)] == [
        ("c1", "alpha"),
        ("c2", "beta"),
        ("c3", "gamma"),
    ]
    prov2 = FakeProvider(backend, say("resumed"))
    async with await create_toolkit(
        builtins=False, extra_tools=relays("alpha", "beta", "gamma")
    ) as tk2:
        r2 = await prov2.client(system_prompt="Be brief").run_with_answer(
            tk2, loaded["messages"], pend, Answer.from_dict(loaded["answer"])
        )
    assert r2.status == "done" and r2.text == "resumed"
    assert prov2.results_seen() == {"c1": "alpha!", "c2": "beta!", "c3": "gamma!"}
    assert_balanced(r2.messages, prov2.shape)


@all_backends
async def test_non_relay_resume_across_a_json_round_trip(backend):
    def fresh():
        return Gate("login", prompt="Log in", url="https://login.test")

    prov1 = FakeProvider(backend, calls(C("c1", "login", {"user": "ada"})))
    async with await kit(fresh()) as tk:
        r1 = await prov1.client().run("go", tk)
    stored = json.dumps(
        {
            "messages": r1.messages,
            "pending": r1.pending.to_dict(),
            "answer": Answer(id=r1.pending.id, ok=True, data={"code": 42}).to_dict(),
        }
    )

    loaded = json.loads(stored)
    gate2 = fresh()
    prov2 = FakeProvider(backend, say("in"))
    async with await kit(gate2) as tk2:
        r2 = await prov2.client().run_with_answer(
            tk2,
            loaded["messages"],
            Request.from_dict(loaded["pending"]),
            Answer.from_dict(loaded["answer"]),
        )
    assert r2.status == "done" and gate2.done == 1
    assert gate2.runs[-1][0] == {"user": "ada"}
    assert prov2.results_seen() == {"c1": 'login done with {"code": 42}'}


async def test_anthropic_resume_sends_the_configured_system_prompt():
    prov = FakeProvider("anthropic", calls(C("t1", "login")), say("ok"))
    async with await kit(Gate("login")) as tk:
        client = prov.client(system_prompt="Be brief")
        r1 = await client.run("go", tk)
        assert all(m["role"] != "system" for m in r1.messages)
        await client.run_with_answer(tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True))
    assert prov.bodies[0]["system"] == "Be brief"
    assert prov.last["system"] == "Be brief"


async def test_openai_resume_does_not_duplicate_the_system_message():
    prov = FakeProvider("openai", calls(C("c1", "login")), say("ok"))
    async with await kit(Gate("login")) as tk:
        client = prov.client(system_prompt="Be brief")
        r1 = await client.run("go", tk)
        await client.run_with_answer(tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True))
    assert prov.bodies[0]["messages"][0] == {"role": "system", "content": "Be brief"}
    assert [m["role"] for m in prov.last["messages"]].count("system") == 1


def test_run_with_answer_sync_twin_resumes_to_done():
    prov = FakeProvider("inprocess", calls(C("c1", "refund")), say("sync done"))
    import asyncio

    tk = asyncio.run(create_toolkit(builtins=False, extra_tools=relays("refund")))
    client = prov.client()
    r1 = client.run_sync("go", tk)
    assert r1.status == "pending"
    r2 = client.run_with_answer_sync(
        tk, r1.messages, r1.pending, answer_output(r1.pending.id, "refunded")
    )
    assert r2.status == "done" and r2.text == "sync done"
    assert prov.results_seen() == {"c1": "refunded"}
