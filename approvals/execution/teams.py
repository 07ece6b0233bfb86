"""Team runs: an agent registered with a team is driven by the engine's agent runtime.

A team run is stored like a single agent's run, plus the runtime's whole state
(`Run.team_state`, `toolnexus.agents.Runtime.to_dict()`: every handle, its checkpoint and
its transcript). A step of a team run (see runner.drive):

- starts the coordinator with `Runtime.run` when the run has no state yet;
- else resumes the stored state with `Runtime.resume(answer)`: the decided request is the
  asking agent's own (its `data.path` names it), so the answer goes to that sub-agent, which
  resumes from its checkpoint, then each agent above it re-attaches to it;
- or, for a finished run given a follow-up (the stored transcript ends with it), continues
  the coordinator with it (`Runtime.follow_up`), its conversation and its team kept;
- ends done, incomplete, or halted again on the request of whichever agent asked, stored
  exactly as a single agent's halt is (an ApprovalRequest whose `data.path` names the chain).

The state is written only with the step's outcome, in the same transaction as the request
it halts on and the decision it applied. A worker killed mid-step leaves the state of
before the step, and the step is driven again from there: the same handles are started
again under the same ids (ids are counted, never random), and every tool a handle ran is
in the journal under (handle, transcript position, call id), so it is not run again.

`run.messages` of a team run is the coordinator's transcript (with its halted turn while it
waits), so everything that reads a run's transcript reads the top of the tree; the run page
shows every handle's own (`selectors.team_tree`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolnexus import Answer, Client, RunResult
from toolnexus.agents import AgentResult, Runtime
from toolnexus.loop import WaitFor

from .. import agents
from ..models import ApprovalRequest, Run

__all__ = [
    "TeamRunFailed",
    "TeamRunResult",
    "drive",
    "follow_up_of",
    "halted_position",
    "top_transcript",
]

# The top-level statuses a run stores as its outcome; any other one fails the run.
_STORED = ("done", "pending", "incomplete")


class TeamRunFailed(RuntimeError):
    """The coordinator ended interrupted, timed out, closed or in error: the run fails with
    it, and keeps the state of before the step (a retry drives the step again)."""


@dataclass(slots=True)
class TeamRunResult(RunResult):
    """A step's outcome as the store writes a single run's, with the runtime's new state."""

    team_state: dict[str, Any] | None = None


def _totals(state: dict[str, Any] | None) -> tuple[int, dict[str, int]]:
    """Model turns and token usage of every handle of a saved state (each handle's own)."""
    turns, usage = 0, {}
    for h in (state or {}).get("handles") or []:
        turns += int(h.get("turns") or 0)
        for key, value in (h.get("usage") or {}).items():
            usage[key] = usage.get(key, 0) + int(value or 0)
    return turns, usage


def top_transcript(state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The coordinator's transcript: its stored conversation, plus the turn it halted on
    while it waits (as a single run's transcript holds its halted turn)."""
    if not state or not state.get("top"):
        return []
    top = state["top"]
    messages = list((state.get("conversations") or {}).get(top) or [])
    handle = next((h for h in state.get("handles") or [] if h.get("id") == top), None)
    checkpoint = (handle or {}).get("checkpoint") or {}
    return messages + list(checkpoint.get("messages") or [])


def follow_up_of(run: Run) -> str | None:
    """The follow-up a finished team run was given (services.run_follow_up adds it to the
    stored transcript, the coordinator's, one message past what the state holds), or None."""
    messages = run.messages or []
    held = top_transcript(run.team_state)
    if len(messages) != len(held) + 1:
        return None
    last = messages[-1]
    if last.get("role") != "user" or not isinstance(last.get("content"), str):
        return None
    return last["content"]


def halted_position(run: Run) -> tuple[str, int]:
    """Where the halted call of the run's open or decided request sits: the asking handle
    and the position of its halted turn in that handle's transcript (the journal's key for
    the relay executors run for it). ("", -1) when the state names no suspended asker."""
    state = run.team_state or {}
    handles = {h.get("id"): h for h in state.get("handles") or []}
    h = handles.get(state.get("top"))
    asker = None
    while h is not None and h.get("state") == "suspended" and h.get("checkpoint"):
        asker = h
        awaiting = h["checkpoint"].get("awaiting")
        h = handles.get(awaiting) if awaiting else None
    if asker is None:
        return "", -1
    conversation = (state.get("conversations") or {}).get(asker["id"]) or []
    return asker["id"], len(conversation)


def _result(
    outcome: AgentResult, state: dict[str, Any], before: dict[str, Any] | None
) -> TeamRunResult:
    if outcome.status not in _STORED:
        raise TeamRunFailed(f"agent {outcome.agent} ended {outcome.status}: {outcome.text}")
    turns_before, usage_before = _totals(before)
    turns_after, usage_after = _totals(state)
    usage = {k: v - usage_before.get(k, 0) for k, v in usage_after.items()}
    return TeamRunResult(
        status=outcome.status,
        text=outcome.text,
        messages=top_transcript(state),
        pending=outcome.pending,
        turns=turns_after - turns_before,
        usage=usage,
        limit=outcome.limit,
        team_state=state,
    )


async def drive(
    run: Run,
    agent: agents.Agent,
    client: Client,
    toolkit: Any,
    request: ApprovalRequest | None,
    answer: Answer | None,
    *,
    wait_for: WaitFor | None = None,
) -> TeamRunResult:
    """One step of a team run on the step's toolkit (its tools journaled) and client.
    `wait_for` (the step's rules) is asked first about every call that suspends, at any
    depth: a call it decides never climbs; for the others it answers HALT."""
    before = run.team_state
    runtime = Runtime(
        agent.team,
        client=client,
        toolkit=toolkit,
        budget=agent.team_budget,
        wait_for=wait_for,
        state=before,
    )
    if before is None:
        outcome = await runtime.run(agent.coordinator, run.prompt)
    elif request is not None and answer is not None:
        outcome = await runtime.resume(answer)
    elif (message := follow_up_of(run)) is not None:
        outcome = await runtime.follow_up(message)
    else:
        # Stored states are written with a step's outcome only: one that is not halted on a
        # decided request has nothing left to drive.
        raise TeamRunFailed("the team run has no decided request to resume with")
    return _result(outcome, runtime.to_dict(), before)
