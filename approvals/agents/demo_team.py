"""The built-in `demo-team` agent: a support coordinator that delegates refunds to a
refunds agent, both played by a deterministic in-process model (offline, like `demo`).

"Plan a refund for order A-1001, $250" starts the coordinator, which hands the prompt to the
refunds agent through `task`; the refunds agent relays `refund` (the demo's relay tool, run
by the demo's executor once approved), so the request reaches the inbox from two levels down
(its chain reads "coordinator > refunds"). Declined, the refunds agent reads the reason and
offers something else; approved, it reports the refund; either way the coordinator then
reports what the refunds agent said.
"""

from __future__ import annotations

from typing import Any

from toolnexus import InProcessRequest, InProcessResponse, InProcessToolCall
from toolnexus import create_in_process_client as in_process
from toolnexus.agents import Agent, Budget

from .demo import demo_generate, demo_tools, issue_refund
from .registry import register

NAME = "demo-team"
COORDINATOR_PROMPT = (
    "You coordinate customer support. Hand refunds to the refunds agent and report back."
)
REFUNDS_PROMPT = "You issue refunds. A refund needs a human's approval."

TEAM = (
    Agent(
        "coordinator",
        system_prompt=COORDINATOR_PROMPT,
        description="routes customer requests",
        tools=[],
        team=["refunds"],
    ),
    Agent(
        "refunds",
        system_prompt=REFUNDS_PROMPT,
        description="issues refunds (each one approved by a person)",
        tools=["refund"],
        budget=Budget(max_turns=4),
    ),
)


def _user_text(messages: list[dict[str, Any]]) -> str:
    return next(
        (m["content"] for m in messages if m.get("role") == "user" and m.get("content")), ""
    )


def _coordinate(request: InProcessRequest) -> InProcessResponse:
    messages = request.messages
    last = messages[-1] if messages else {}
    if last.get("role") == "user":  # a new ask: the run's prompt, or a follow-up
        asks = sum(1 for m in messages if m.get("role") == "user")
        task = {"agent": "refunds", "prompt": last.get("content") or _user_text(messages)}
        call_id = "call_task" if asks == 1 else f"call_task_{asks}"
        return InProcessResponse(
            content="I will ask the refunds desk.",
            tool_calls=[InProcessToolCall(call_id, "task", task)],
            usage={"prompt_tokens": 50, "completion_tokens": 14},
        )
    results = [m for m in messages if m.get("role") == "tool"]
    said = (results[-1].get("content") or "") if results else ""
    return InProcessResponse(
        content=f"The refunds desk reports: {said}",
        usage={"prompt_tokens": 70, "completion_tokens": 25},
    )


def team_generate(request: InProcessRequest) -> InProcessResponse:
    """The coordinator plans and reports; the refunds agent is the demo's own model."""
    first = request.messages[0] if request.messages else {}
    if first.get("role") == "system" and first.get("content") == COORDINATOR_PROMPT:
        return _coordinate(request)
    return demo_generate(request)


def register_demo_team() -> None:
    register(
        NAME,
        model=lambda: in_process(generate=team_generate, model="demo-team-in-process"),
        tools=demo_tools,
        executors={"refund": issue_refund},
        system_prompt=COORDINATOR_PROMPT,
        description="Offline demo team: a coordinator delegates a refund to a refunds agent.",
        team=TEAM,
        team_budget=Budget(max_tokens=20_000),
    )
