"""toolnexus.agents three levels deep, and budgets across a durable resume (issue 35).

Upstream behaviours ported here (test_agents.py has the two-level ones): the transcript
rewound on a durable pending at EVERY suspended level, not just the top two; the resume
cascade going up through a middle agent whose repeated `task` call re-attaches to its
suspended child (no duplicate at any level, each model asked exactly once more, each
level's transitions `suspended→idle` then `idle→running`); and budgets ending `incomplete`
naming the limit when the limit is reached after a durable resume (turns and tokens grow
across the halt, never reset by the state's round trip), partial work kept.
"""

from __future__ import annotations

import pytest

from tests.engine.helpers import (
    BACKENDS,
    C,
    Probe,
    assert_balanced,
    calls,
    kit,
    result_map,
    say,
    shape,
    tool_call_ids,
)
from tests.engine.test_agents import Refund, Team, agent, roundtrip, task
from toolnexus import Answer, Budget, Runtime

COORDINATOR = "root/coordinator.1"
DESK = f"{COORDINATOR}/desk.1"
REFUNDS = f"{DESK}/refunds.1"
ONCE = ["idle→running", "running→suspended", "suspended→idle", "idle→running", "running→idle"]


def _chain(**budgets: Budget):
    return [
        agent("coordinator", team=["desk"], budget=budgets.get("coordinator")),
        agent("desk", team=["refunds"], budget=budgets.get("desk")),
        agent("refunds", tools=["refund", "lookup"], budget=budgets.get("refunds")),
    ]


def _phase1(backend: str = "inprocess") -> Team:
    return Team(
        backend,
        coordinator=[calls(task("t1", "desk", "refund the customer 40"))],
        desk=[calls(task("d1", "refunds", "refund 40"))],
        refunds=[calls(C("r1", "refund", {"amount": 40}))],
    )


async def _halt(tk, team: Team, agents=None, **kw):
    rt = Runtime(agents or _chain(), client=team.client(), toolkit=tk, **kw)
    halted = await rt.run("coordinator", "a customer wants 40 back")
    assert halted.status == "pending", halted.text
    return rt, halted


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_three_level_halt_rewinds_every_level_and_the_resume_re_attaches_at_each(backend):
    refund, lookup = Refund(), Probe("lookup", "order found")
    async with await kit(refund, lookup) as tk:
        rt, halted = await _halt(tk, _phase1(backend))
    assert halted.pending.kind == "approval"
    assert halted.pending.data["path"] == REFUNDS.split("/")
    assert [(h.id, h.state) for h in rt.handles()] == [
        (COORDINATOR, "suspended"),
        (DESK, "suspended"),
        (REFUNDS, "suspended"),
    ]
    style = shape(backend)
    for hid, prompt_seen in (
        (COORDINATOR, "a customer wants 40 back"),
        (DESK, "refund the customer 40"),
        (REFUNDS, "refund 40"),
    ):
        stored = rt.conversations.get(hid)
        # rewound: no assistant turn, no placeholder result committed at any level
        assert [m["role"] for m in stored if m["role"] != "system"] == ["user"], hid
        assert tool_call_ids(stored, style) == [], hid
        assert prompt_seen in str(stored[-1]["content"])
        assert rt.handle(hid).checkpoint["messages"][0]["role"] == "assistant", hid
    assert rt.handle(COORDINATOR).checkpoint["awaiting"] == DESK
    assert rt.handle(DESK).checkpoint["awaiting"] == REFUNDS
    tokens_before = rt.handle(REFUNDS).usage["total_tokens"]

    # another process: the state from JSON, fresh models and tools
    team2 = Team(
        backend,
        refunds=[say("refund issued")],
        desk=[say("desk: refund issued")],
        coordinator=[say("customer refunded")],
    )
    async with await kit(refund, lookup) as tk2:
        rt2 = Runtime(_chain(), client=team2.client(), toolkit=tk2, state=roundtrip(rt.to_dict()))
        assert rt2.pending.to_dict() == halted.pending.to_dict()
        done = await rt2.resume(Answer(id=halted.pending.id, ok=True))
    assert (done.status, done.text) == ("done", "customer refunded")
    assert refund.count == 1
    # each level asked its model once more; each parent read its child's final text
    assert {name: len(bodies) for name, bodies in team2.seen.items()} == {
        "refunds": 1,
        "desk": 1,
        "coordinator": 1,
    }
    assert team2.results("refunds", 0) == {"r1": "refunded 40"}
    assert team2.results("desk", 0) == {"d1": "refund issued"}
    assert team2.results("coordinator", 0) == {"t1": "desk: refund issued"}
    # re-attached, never duplicated: one handle per level, each started once
    assert [h.id for h in rt2.handles()] == [COORDINATOR, DESK, REFUNDS]
    assert rt2.handle(COORDINATOR).transitions == ONCE
    assert rt2.handle(DESK).transitions == [*ONCE, "idle→closed"]
    assert rt2.handle(REFUNDS).transitions == [*ONCE, "idle→closed"]
    assert rt2.handle(REFUNDS).turns == 2
    assert rt2.handle(REFUNDS).usage["total_tokens"] > tokens_before
    # every level's final transcript holds its delegation once, answered once
    for hid, call_id in ((COORDINATOR, "t1"), (DESK, "d1"), (REFUNDS, "r1")):
        final = rt2.conversations.get(hid)
        assert_balanced(final, style)
        assert tool_call_ids(final, style) == [call_id], hid
        assert rt2.handle(hid).checkpoint is None
    assert result_map(done.messages, style) == {"t1": "desk: refund issued"}


async def test_a_middle_agent_resumed_twice_from_the_same_state_re_attaches_the_same_child():
    """A host that lost a resume's outcome (a killed worker) resumes the stored state again:
    the same handles, no new child, the same result."""
    refund = Refund()
    async with await kit(refund, Probe("lookup")) as tk:
        rt, halted = await _halt(tk, _phase1())
        state = roundtrip(rt.to_dict())
        outcomes = []
        for _ in range(2):
            team = Team(
                refunds=[say("refund issued")],
                desk=[say("desk: refund issued")],
                coordinator=[say("customer refunded")],
            )
            again = Runtime(_chain(), client=team.client(), toolkit=tk, state=state)
            done = await again.resume(Answer(id=halted.pending.id, ok=True))
            outcomes.append((done.status, done.text, [h.id for h in again.handles()]))
    assert outcomes[0] == outcomes[1] == ("done", "customer refunded", [COORDINATOR, DESK, REFUNDS])


async def test_a_turn_budget_counts_the_turns_before_the_halt_and_ends_incomplete_on_resume():
    refund, lookup = Refund(), Probe("lookup", "order found")
    agents = _chain(refunds=Budget(max_turns=2))
    async with await kit(refund, lookup) as tk:
        rt, halted = await _halt(tk, _phase1(), agents)
        team2 = Team(
            # turn 2 looks the order up; a third turn would pass the cap of 2
            refunds=[calls(C("l1", "lookup")), say("never said")],
            desk=[lambda body: say("desk read: " + result_map(body["messages"], "openai")["d1"])],
            coordinator=[say("customer told")],
        )
        rt2 = Runtime(agents, client=team2.client(), toolkit=tk, state=roundtrip(rt.to_dict()))
        done = await rt2.resume(Answer(id=halted.pending.id, ok=True))
    assert (done.status, done.text) == ("done", "customer told")
    refunds = rt2.handle(REFUNDS)
    assert (refunds.outcome["status"], refunds.outcome["limit"]) == ("incomplete", "maxTurns")
    assert refunds.turns == 2 and len(team2.seen["refunds"]) == 1
    # partial work kept: the approved refund and the lookup ran, their results stored
    assert (refund.count, lookup.count) == (1, 1)
    assert result_map(rt2.conversations.get(REFUNDS), "openai") == {
        "r1": "refunded 40",
        "l1": "order found",
    }
    assert team2.results("desk", 0) == {"d1": "agent refunds ended incomplete (maxTurns)"}
    assert [h.id for h in rt2.handles()] == [COORDINATOR, DESK, REFUNDS]


async def test_a_token_budget_counts_what_was_spent_before_the_halt():
    """Each model turn costs 5 tokens: 15 before the halt (one turn per level). With a tree
    budget of 17, the deepest agent's turn after the resume is allowed (15 spent), the desk's
    next one is not (20): had the state's round trip reset the usage, every level would run."""
    refund = Refund()
    async with await kit(refund, Probe("lookup")) as tk:
        rt, halted = await _halt(tk, _phase1(), budget=Budget(max_tokens=17))
        assert rt.result().usage["total_tokens"] == 15
        team2 = Team(
            refunds=[say("refund issued")],
            desk=[say("never said")],
            coordinator=[say("customer told")],
        )
        rt2 = Runtime(
            _chain(),
            client=team2.client(),
            toolkit=tk,
            budget=Budget(max_tokens=17),
            state=roundtrip(rt.to_dict()),
        )
        done = await rt2.resume(Answer(id=halted.pending.id, ok=True))
    assert (done.status, done.limit) == ("incomplete", "maxTokens")
    assert done.usage["total_tokens"] == 20
    assert refund.count == 1  # the work done is kept
    assert rt2.handle(REFUNDS).outcome["text"] == "refund issued"
    desk = rt2.handle(DESK)
    assert (desk.outcome["status"], desk.outcome["limit"]) == ("incomplete", "maxTokens")
    assert "desk" not in team2.seen and "coordinator" not in team2.seen
    assert [h.id for h in rt2.handles()] == [COORDINATOR, DESK, REFUNDS]
