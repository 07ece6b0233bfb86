"""The runtime's data: agent definitions, budgets, handles, results, the conversation store.

Everything here that the runtime saves is plain JSON (`Handle.to_dict`,
`ConversationStore.to_dict`); `Budget` and `Agent` come from the host's code, never from
saved state.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..loop import WaitFor, _zero_usage
from ..types import Request

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "ROOT",
    "STATE_VERSION",
    "STATUSES",
    "SUBAGENT_KIND",
    "Agent",
    "AgentResult",
    "Budget",
    "ConversationStore",
    "Handle",
]

STATUSES = ("done", "pending", "incomplete", "interrupted", "closed", "timeout", "error")
# The request a parent's `task` call halts on while its child is suspended. Internal: the
# runtime reports the asking agent's own request to the host, never this one.
SUBAGENT_KIND = "subagent"
ROOT = "root"
DEFAULT_MAX_DEPTH = 4
STATE_VERSION = 1


def add_usage(into: dict[str, int], usage: Mapping[str, int] | None) -> None:
    for key, value in (usage or {}).items():
        into[key] = into.get(key, 0) + value


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits; `None` is no limit.

    `max_turns`: the handle's own model turns over its life (resumes included).
    `max_tokens`, `max_tool_calls`: spent by the handle and everything it delegated, checked
    up the chain of ancestors before each model turn and each spawn.
    `max_children`: children it may start. `max_depth`: levels of handles below it.
    On the runtime, the budget bounds the whole tree; its `max_turns` is the default for
    agents that set none (else the client's `max_turns`).
    """

    max_turns: int | None = None
    max_tokens: int | None = None
    max_tool_calls: int | None = None
    max_children: int | None = None
    max_depth: int | None = None


@dataclass(slots=True)
class Agent:
    """An agent definition. `tools`: names from the runtime's toolkit (None: all of them).
    `team`: the agents it may delegate to through `task` (none: no `task` tool).
    `wait_for`: answers suspensions of this agent and of every agent below it."""

    name: str
    system_prompt: str = ""
    description: str = ""
    tools: Sequence[str] | None = None
    team: Sequence[str] = ()
    budget: Budget | None = None
    wait_for: WaitFor | None = None
    model: str | None = None


@dataclass(slots=True)
class AgentResult:
    """How a handle's run ended. `status` is one of `STATUSES`; `pending` (iff pending) is
    the asking agent's request with `data.path`; `turns` are the handle's own; `usage` and
    `tool_calls` count the handle and everything it delegated; `messages` is the handle's
    stored transcript."""

    status: str
    text: str
    handle: str
    agent: str
    pending: Request | None = None
    turns: int = 0
    usage: dict[str, int] = field(default_factory=_zero_usage)
    tool_calls: int = 0
    limit: str | None = None
    error: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Handle:
    """One agent started by the runtime. Read it; the runtime alone changes it.

    `state`: idle | running | suspended | closed. `checkpoint` (while suspended): the halted
    model turn (`messages`), the request the handle's loop halted on (`pending`) and the
    child it waits for (`awaiting`, when the halt came from a `task` call). `outcome`: the
    recorded end of its last run (`status`, `text`, `limit`, `error`).
    """

    id: str
    agent: str | None
    prompt: str = ""
    parent: str | None = None
    depth: int = 0
    state: str = "idle"
    seq: int = 0
    children: list[str] = field(default_factory=list)
    turns: int = 0
    usage: dict[str, int] = field(default_factory=_zero_usage)
    tool_calls: int = 0
    checkpoint: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    transitions: list[str] = field(default_factory=list)
    # In memory only: the run in flight (its usage so far) and who awaits it.
    live_usage: dict[str, int] | None = field(default=None, repr=False, compare=False)
    live_calls: int = field(default=0, repr=False, compare=False)
    asking: int = field(default=0, repr=False, compare=False)
    inflight: asyncio.Future[AgentResult] | None = field(default=None, repr=False, compare=False)

    _SAVED = (
        "id",
        "agent",
        "prompt",
        "parent",
        "depth",
        "state",
        "seq",
        "children",
        "turns",
        "usage",
        "tool_calls",
        "checkpoint",
        "outcome",
        "transitions",
    )

    def to_dict(self) -> dict[str, Any]:
        """A deep copy: changing it never changes the handle."""
        return copy.deepcopy({name: getattr(self, name) for name in self._SAVED})

    @classmethod
    def from_dict(cls, d: Any) -> Handle:
        if not isinstance(d, Mapping) or not isinstance(d.get("id"), str):
            raise ValueError("a saved handle must be an object with a string id")
        kwargs = copy.deepcopy({name: d[name] for name in cls._SAVED if name in d})
        kwargs["children"] = list(kwargs.get("children") or [])
        kwargs["usage"] = {**_zero_usage(), **dict(kwargs.get("usage") or {})}
        kwargs["transitions"] = list(kwargs.get("transitions") or [])
        return cls(**kwargs)


class ConversationStore:
    """Every handle's transcript, by handle id (one store for the whole runtime)."""

    def __init__(self, data: Mapping[str, list[dict[str, Any]]] | None = None) -> None:
        self._data: dict[str, list[dict[str, Any]]] = {
            k: list(v) for k, v in copy.deepcopy(dict(data or {})).items()
        }

    def get(self, handle_id: str) -> list[dict[str, Any]]:
        return list(self._data.get(handle_id, ()))

    def save(self, handle_id: str, messages: Iterable[dict[str, Any]]) -> None:
        self._data[handle_id] = list(messages)

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        """A deep copy: changing it never changes the store."""
        return copy.deepcopy(self._data)
