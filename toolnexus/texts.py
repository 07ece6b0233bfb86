"""Every text the model reads that the engine writes: one module, so a wording is changed once.

The loop, relay tools, the approval gate and the builtins build their tool results from
these functions, and a host that shows or stores what the model was told (an audit trail, a
demo model that answers a decline) imports them from here instead of copying the format.
The decline texts are pinned by the contract:

- a relay call refused by the host: `relay declined for <name>: <reason>`;
- any other suspension refused: `declined/expired: <prompt> (reason: <reason>)`;

the reason defaulting to `declined`, so the model never reads a refusal with nothing attached.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEFAULT_REASON",
    "FAILURE_PREFIXES",
    "agent_stopped",
    "approval_prompt",
    "declined",
    "declined_reason",
    "edited_arguments_invalid",
    "invalid_arguments",
    "is_declined",
    "limit_reached",
    "no_result_on_resume",
    "not_approved",
    "not_in_team",
    "question_not_answered",
    "question_prompt",
    "relay_declined",
    "relay_prompt",
    "task_description",
    "task_needs_prompt",
    "tool_failed",
    "tool_returned",
    "unknown_tool",
    "unresolved",
]

DEFAULT_REASON = "declined"

_RELAY_DECLINED = "relay declined for "
_DECLINED = "declined/expired: "


def _reason(reason: str | None) -> str:
    return reason or DEFAULT_REASON


# -- suspensions and their refusals -----------------------------------------------------------


def relay_prompt(name: str) -> str:
    """The prompt of a relay request, and the placeholder the halted relay call reads."""
    return f"relay tool call {name} to the caller for execution"


def relay_declined(name: str, reason: str | None) -> str:
    """A relayed call the host refused."""
    return f"{_RELAY_DECLINED}{name}: {_reason(reason)}"


def declined(prompt: str, reason: str | None) -> str:
    """Any other suspension (approval, question, input, authorization) refused or expired."""
    return f"{_DECLINED}{prompt} (reason: {_reason(reason)})"


def no_result_on_resume(name: str) -> str:
    """A relayed call the host's answer left without a result."""
    return f"no result supplied on resume for {name}"


def unresolved(prompt: str) -> str:
    """A call that suspended again after it was run with its answer (never looped)."""
    return f"unresolved: {prompt}"


def is_declined(text: str) -> bool:
    """True for either decline text above."""
    return text.startswith((_RELAY_DECLINED, _DECLINED))


_DECLINED_REASON = re.compile(r"\(reason: (.*)\)\Z", re.DOTALL)


def declined_reason(text: str) -> str | None:
    """The reason carried by a decline text, or None when `text` is not one."""
    if text.startswith(_RELAY_DECLINED):
        return text.split(": ", 1)[1] if ": " in text else DEFAULT_REASON
    if text.startswith(_DECLINED):
        found = _DECLINED_REASON.search(text)
        return found.group(1) if found else DEFAULT_REASON
    return None


# -- tool calls that did not run as asked ---------------------------------------------------


def invalid_arguments(name: str, error: str) -> str:
    return f"invalid arguments for {name}: {error}"


def unknown_tool(name: str) -> str:
    return f"Unknown tool: {name}"


def tool_failed(name: str, exc: BaseException) -> str:
    return f"tool {name} failed: {type(exc).__name__}: {exc}"


def tool_returned(name: str, value: Any) -> str:
    return f"tool {name} returned {type(value).__name__}, not a ToolResult"


# Results the model reads when a call did not go through for a reason other than a decline.
FAILURE_PREFIXES: tuple[str, ...] = (
    "unresolved:",
    "no result supplied",
    "invalid arguments",
    "edited arguments",
)


# -- the approval gate and the question builtin ---------------------------------------------


def approval_prompt(name: str, args: dict[str, Any]) -> str:
    """The gate's default prompt (the reviewer's question, and the halted call's placeholder)."""
    shown = json.dumps(args, ensure_ascii=False, sort_keys=True)
    return f"Allow {name} to run with {shown}?"


def not_approved(name: str, reason: str | None) -> str:
    """The gate's own refusal text, when a refusal reaches the tool itself (inline answers)."""
    return f"{name} was not approved (reason: {_reason(reason)})"


def edited_arguments_invalid(name: str, problem: str) -> str:
    return f"edited arguments for {name} are invalid: {problem}"


def _option_label(option: Any) -> str:
    if isinstance(option, Mapping):
        return str(option.get("label", ""))
    return str(option)


def question_prompt(questions: Any) -> str:
    """The question builtin's prompt: one line per question, its options in brackets."""
    lines: list[str] = []
    for q in questions if isinstance(questions, list) else []:
        if not isinstance(q, Mapping):
            continue
        text = str(q.get("question", ""))
        options = q.get("options")
        if isinstance(options, list) and options:
            text += f" (options: {', '.join(_option_label(o) for o in options)})"
        lines.append(text)
    return "\n".join(lines)


def question_not_answered(reason: str | None) -> str:
    return f"question was not answered (reason: {_reason(reason)})"


# -- agents that delegate (toolnexus.agents) --------------------------------------------------


def task_description(team: list[tuple[str, str]]) -> str:
    """The `task` tool's description: the caller's team only, sorted by name."""
    listed = "; ".join(f"{name}: {what}" if what else name for name, what in team)
    return (
        "Delegate a piece of work to an agent of your team; you get back its final answer. "
        f"Team: {listed}."
    )


def not_in_team(agent: Any, team: list[str]) -> str:
    return f"agent {agent!r} is not in this agent's team (team: {', '.join(team) or 'none'})"


def task_needs_prompt(agent: str) -> str:
    return f"task for {agent} needs a non-empty prompt"


def limit_reached(limit: str, value: int, agent: str) -> str:
    """A spawn refused by a budget: no agent was started."""
    return f"{limit} {value} reached: agent {agent} was not started"


def agent_stopped(agent: str, status: str, detail: str | None, text: str) -> str:
    """What a parent reads when a sub-agent ended other than `done`."""
    head = f"agent {agent} ended {status}" + (f" ({detail})" if detail else "")
    return f"{head}: {text}" if text else head
