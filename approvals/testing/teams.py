"""Scripted teams: one in-process model plays every member of an agent's team, each from its
own script (`ScriptedModel` turns), told apart by the member's system prompt."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from toolnexus import InProcessRequest, InProcessResponse, Tool, create_in_process_client
from toolnexus.agents import Agent as TeamMember

from .. import agents

__all__ = ["ScriptedTeam", "register_scripted_team", "scripted_team"]


class ScriptedTeam:
    """`members[name]` is that member's `ScriptedModel`; `generate` routes each model call to
    the member whose system prompt the request starts with."""

    def __init__(self, name: str, team: Sequence[TeamMember], scripts: Mapping[str, Sequence[Any]]):
        from . import ScriptedModel  # the package's own (it imports this module)

        prompts = [m.system_prompt for m in team]
        if not all(prompts) or len(set(prompts)) != len(prompts):
            raise ValueError("each team member needs a system prompt of its own to be scripted")
        unknown = sorted(set(scripts) - {m.name for m in team})
        if unknown:
            raise ValueError(f"scripts for agents not in the team: {unknown}")
        self.name = name
        self.members = {m.name: ScriptedModel(*scripts.get(m.name, ()), name=m.name) for m in team}
        self._by_prompt = {m.system_prompt: self.members[m.name] for m in team}

    def generate(self, request: InProcessRequest) -> InProcessResponse:
        first = request.messages[0] if request.messages else {}
        system = first.get("content") if first.get("role") == "system" else None
        model = self._by_prompt.get(system)
        if model is None:
            raise AssertionError(f"no team member has the system prompt {system!r}")
        return model.generate(request)

    def client(self):
        return create_in_process_client(generate=self.generate, model=self.name)


def register_scripted_team(
    name: str,
    scripts: Mapping[str, Sequence[Any]],
    *,
    team: Sequence[TeamMember],
    tools: Iterable[Tool] | Callable[[], Iterable[Tool]] = (),
    executors: dict[str, Callable[[dict[str, Any]], Any]] | None = None,
    **options: Any,
) -> ScriptedTeam:
    """Register (or replace) agent `name` as a team (`team`, the coordinator first) whose
    members' models play `scripts[member]` (see `ScriptedModel`). `options` go to
    `agents.register` (team_budget, allow_typed_output, ...)."""
    model = ScriptedTeam(name, team, scripts)
    agents.register(
        name,
        model=model.client,
        tools=tools,
        executors=executors,
        team=team,
        replace=True,
        **options,
    )
    return model


@contextmanager
def scripted_team(
    name: str, scripts: Mapping[str, Sequence[Any]], **options: Any
) -> Iterator[ScriptedTeam]:
    """`register_scripted_team` for the length of a `with` block; the agent that had the
    name before is back after it (or none)."""
    before = agents.get(name)
    try:
        yield register_scripted_team(name, scripts, **options)
    finally:
        agents.restore(name, before)
