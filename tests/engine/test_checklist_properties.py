"""Checklist (property): whatever mix of real, gated and relay calls a turn holds, halting
and resuming until done runs every tool for real exactly once, keeps every recorded result,
and hands the model a balanced turn with the right output in every slot."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import (
    C,
    FakeProvider,
    Gate,
    Probe,
    assert_balanced,
    calls,
    say,
)
from toolnexus import Answer, create_toolkit
from toolnexus.relay import RelayResult, relay_answer, relay_calls_of, relay_tool

KINDS = st.lists(st.sampled_from(["real", "gate", "relay"]), min_size=1, max_size=5)


async def _scenario(kinds: list[str], backend: str) -> None:
    tools, expected, probes, gates = [], {}, [], []
    for i, k in enumerate(kinds):
        name = f"{k}{i}"
        if k == "real":
            p = Probe(name, output=f"real-{i}")
            probes.append(p)
            tools.append(p.tool)
            expected[f"c{i}"] = f"real-{i}"
        elif k == "gate":
            g = Gate(name, kind="approval", prompt=f"ok {i}?")
            gates.append(g)
            tools.append(g.tool)
            expected[f"c{i}"] = f"{name} done with {{}}"
        else:
            tools.append(relay_tool(name, name))
            expected[f"c{i}"] = f"relay-{i}"
    turn = calls(*[C(f"c{i}", f"{k}{i}") for i, k in enumerate(kinds)])
    prov = FakeProvider(backend, turn, say("finished"))
    async with await create_toolkit(builtins=False, extra_tools=tools) as tk:
        client = prov.client()
        r = await client.run("go", tk)
        rounds = 0
        while r.status == "pending":
            rounds += 1
            assert rounds <= len(kinds), "resume never converged"
            assert len(prov.bodies) == 1
            if r.pending.kind == "tool_call":
                ans = relay_answer(
                    r.pending.id,
                    [RelayResult(c.id, f"relay-{c.id[1:]}") for c in relay_calls_of(r.pending)],
                )
            else:
                ans = Answer(id=r.pending.id, ok=True)
            r = await client.run_with_answer(tk, r.messages, r.pending, ans)
    assert r.status == "done" and r.text == "finished"
    assert all(p.count == 1 for p in probes)
    assert all(g.done == 1 for g in gates)
    assert prov.results_seen() == expected
    assert list(prov.results_seen()) == [f"c{i}" for i in range(len(kinds))]
    assert_balanced(r.messages, prov.shape)


@settings(max_examples=40, deadline=None)
@given(kinds=KINDS, backend=st.sampled_from(["openai", "anthropic", "inprocess"]))
def test_any_mix_of_calls_resumes_to_a_balanced_turn_with_every_tool_run_once(kinds, backend):
    asyncio.run(_scenario(kinds, backend))
