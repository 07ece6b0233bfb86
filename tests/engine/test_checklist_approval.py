"""Checklist: the approval gate (`approval_required`), inline and across a durable halt."""

from __future__ import annotations

import pytest

from tests.engine.helpers import (
    AMOUNT_SCHEMA,
    BACKENDS,
    C,
    FakeProvider,
    Probe,
    assert_balanced,
    calls,
    kit,
    result_map,
    say,
)
from toolnexus import Answer, ToolContext, create_toolkit, pending_of
from toolnexus.approval import approval_required
from toolnexus.relay import answer_declined

all_backends = pytest.mark.parametrize("backend", BACKENDS)


def refund_probe():
    return Probe("refund", output=lambda a: f"refunded {a['amount']}", schema=AMOUNT_SCHEMA)


async def test_gate_first_call_suspends_with_approval_and_tool_data():
    inner = refund_probe()
    gated = approval_required(inner.tool)
    assert gated.name == "refund" and gated.input_schema == AMOUNT_SCHEMA
    async with await create_toolkit(builtins=False, extra_tools=[gated]) as tk:
        res = await tk.execute(
            "refund", {"amount": 5}, ToolContext(call_id="c1", arguments='{"amount":  5}')
        )
    req = pending_of(res)
    assert req is not None and req.kind == "approval"
    assert isinstance(req.prompt, str) and req.prompt
    assert req.data["tool"] == "refund"
    assert req.data["input"] == {"amount": 5}
    assert req.data["arguments"] == '{"amount":  5}'
    assert inner.count == 0


async def test_gate_uses_a_custom_prompt():
    gated = approval_required(refund_probe().tool, prompt="Refund this customer?")
    async with await create_toolkit(builtins=False, extra_tools=[gated]) as tk:
        res = await tk.execute("refund", {"amount": 5}, ToolContext(call_id="c1"))
    assert pending_of(res).prompt == "Refund this customer?"


async def test_gate_runs_the_tool_on_an_ok_answer():
    inner = refund_probe()
    async with await create_toolkit(
        builtins=False, extra_tools=[approval_required(inner.tool)]
    ) as tk:
        res = await tk.execute(
            "refund", {"amount": 5}, ToolContext(answer=Answer(id="r", ok=True), call_id="c1")
        )
    assert res.output == "refunded 5" and inner.count == 1


# -- inline ----------------------------------------------------------------------------------


@all_backends
async def test_inline_approval_request_shows_what_will_run(backend):
    inner = refund_probe()
    seen = []

    def wait_for(q):
        seen.append(q)
        return Answer(id=q.id, ok=True)

    raw = '{"amount": 5}'
    prov = FakeProvider(backend, calls(C("c1", "refund", raw)), say("refunded"))
    async with await kit(approval_required(inner.tool)) as tk:
        r = await prov.client(wait_for=wait_for).run("refund", tk)
    assert r.status == "done" and inner.count == 1
    (q,) = seen
    assert q.kind == "approval" and q.data["tool"] == "refund"
    assert q.data["input"] == {"amount": 5} and q.data["callId"] == "c1"
    if backend != "anthropic":
        assert q.data["arguments"] == raw
    assert prov.results_seen()["c1"] == "refunded 5"


@all_backends
async def test_inline_rejection_means_the_tool_never_runs(backend):
    inner = refund_probe()
    prov = FakeProvider(backend, calls(C("c1", "refund", {"amount": 5})), say("not refunded"))
    async with await kit(approval_required(inner.tool, prompt="Refund?")) as tk:
        r = await prov.client(wait_for=lambda q: answer_declined(q.id, "too much")).run("go", tk)
    assert r.status == "done" and inner.count == 0
    assert prov.results_seen()["c1"] == "declined/expired: Refund? (reason: too much)"


@all_backends
async def test_inline_edited_input_is_what_runs(backend):
    inner = refund_probe()
    prov = FakeProvider(backend, calls(C("c1", "refund", {"amount": 500})), say("ok"))
    async with await kit(approval_required(inner.tool)) as tk:
        await prov.client(
            wait_for=lambda q: Answer(id=q.id, ok=True, data={"input": {"amount": 50}})
        ).run("go", tk)
    assert [a for a, _ in inner.runs] == [{"amount": 50}]
    assert prov.results_seen()["c1"] == "refunded 50"


# -- durable ---------------------------------------------------------------------------------


@all_backends
async def test_two_gated_calls_in_one_turn_are_approved_one_after_the_other(backend):
    inner = refund_probe()
    prov = FakeProvider(
        backend,
        calls(C("c1", "refund", {"amount": 1}), C("c2", "refund", {"amount": 2})),
        say("two refunds"),
    )
    async with await kit(approval_required(inner.tool)) as tk:
        client = prov.client()
        r1 = await client.run("refund both", tk)
        assert r1.status == "pending" and r1.pending.kind == "approval"
        assert r1.pending.data["callId"] == "c1" and r1.pending.data["input"] == {"amount": 1}
        assert inner.count == 0

        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True)
        )
        assert r2.status == "pending" and r2.pending.kind == "approval"
        assert r2.pending.data["callId"] == "c2" and r2.pending.data["input"] == {"amount": 2}
        assert r2.pending.id != r1.pending.id
        assert [a for a, _ in inner.runs] == [{"amount": 1}]
        assert result_map(r2.messages, prov.shape)["c1"] == "refunded 1"
        assert len(prov.bodies) == 1

        r3 = await client.run_with_answer(
            tk, r2.messages, r2.pending, Answer(id=r2.pending.id, ok=True)
        )
    assert r3.status == "done" and r3.text == "two refunds"
    assert [a for a, _ in inner.runs] == [{"amount": 1}, {"amount": 2}]
    assert prov.results_seen() == {"c1": "refunded 1", "c2": "refunded 2"}
    assert_balanced(r3.messages, prov.shape)


@all_backends
async def test_first_approved_second_declined(backend):
    inner = refund_probe()
    prov = FakeProvider(
        backend,
        calls(C("c1", "refund", {"amount": 1}), C("c2", "refund", {"amount": 2})),
        say("one refund"),
    )
    async with await kit(approval_required(inner.tool, prompt="Refund?")) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True)
        )
        r3 = await client.run_with_answer(
            tk, r2.messages, r2.pending, answer_declined(r2.pending.id, "second is a duplicate")
        )
    assert r3.status == "done" and inner.count == 1
    assert prov.results_seen() == {
        "c1": "refunded 1",
        "c2": "declined/expired: Refund? (reason: second is a duplicate)",
    }


@all_backends
async def test_durable_edited_input_is_validated_and_runs_when_valid(backend):
    inner = refund_probe()
    prov = FakeProvider(backend, calls(C("c1", "refund", {"amount": 500})), say("ok"))
    async with await kit(approval_required(inner.tool)) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk,
            r1.messages,
            r1.pending,
            Answer(id=r1.pending.id, ok=True, data={"input": {"amount": 50}}),
        )
    assert r2.status == "done"
    assert [a for a, _ in inner.runs] == [{"amount": 50}]
    assert prov.results_seen()["c1"] == "refunded 50"


@all_backends
@pytest.mark.parametrize("edited", [{"amount": "lots"}, {}, {"amount": 1.5}])
async def test_invalid_edited_input_is_an_error_naming_the_violation(backend, edited):
    inner = refund_probe()
    prov = FakeProvider(backend, calls(C("c1", "refund", {"amount": 500})), say("could not"))
    async with await kit(approval_required(inner.tool)) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True, data={"input": edited})
        )
    assert r2.status == "done" and r2.text == "could not"
    assert inner.count == 0
    seen = prov.results_seen()["c1"]
    assert "amount" in seen
    assert r2.tool_calls[0]["is_error"] is True
    assert_balanced(r2.messages, prov.shape)


@all_backends
async def test_approval_without_edits_runs_the_shown_input(backend):
    inner = refund_probe()
    prov = FakeProvider(backend, calls(C("c1", "refund", {"amount": 7})), say("ok"))
    async with await kit(approval_required(inner.tool)) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True, data={"note": "fine"})
        )
    assert [a for a, _ in inner.runs] == [r1.pending.data["input"]] == [{"amount": 7}]
