"""The agent registry: hosts register named agents in code (see the project's api.md).

    from approvals import agents
    agents.register("support", model=lambda: create_client(...), tools=lambda: [...],
                    executors={"refund": do_refund}, system_prompt="...", description="...")

Every installed app's `agents.py` is imported at start-up, plus the modules named in
settings.TOOLNEXUS_AGENT_MODULES. Keys come from the environment inside `model` factories;
nothing about a model endpoint is stored in the database.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from toolnexus import Client, Tool

__all__ = ["Agent", "UnknownAgent", "all", "get", "register", "require", "unregister"]

ToolsArg = Callable[[], Iterable[Tool]] | Iterable[Tool]


class UnknownAgent(LookupError):
    pass


@dataclass(frozen=True)
class Agent:
    name: str
    model: Callable[[], Client]
    tools: ToolsArg
    executors: dict[str, Callable[[dict[str, Any]], Any]] = field(default_factory=dict)
    system_prompt: str = ""
    description: str = ""
    # A call with an executor runs on the host once approved. Only an agent that says so lets
    # a reviewer or host type that call's result instead (an override of what would run).
    allow_typed_output: bool = False

    def build_tools(self) -> list[Tool]:
        tools = list(self.tools() if callable(self.tools) else self.tools)
        for name in self.executors:
            tool = next((t for t in tools if t.name == name), None)
            if tool is None or tool.source != "relay":
                raise ValueError(
                    f"agent {self.name!r}: executor {name!r} names no relay tool of the agent"
                )
        return tools

    def build_client(self, system_prompt: str | None = None) -> Client:
        client = self.model()
        if not isinstance(client, Client):
            raise TypeError(
                f"agent {self.name!r}: model factory returned {type(client).__name__}, not a toolnexus Client"
            )
        # The run's stored system prompt wins, so a resume sees what the run started with.
        client.system_prompt = self.system_prompt if system_prompt is None else system_prompt
        return client

    def executor_for(self, tool_name: str) -> Callable[[dict[str, Any]], Any] | None:
        return self.executors.get(tool_name)

    def tool_schema(self, tool_name: str) -> dict[str, Any] | None:
        """A tool's input schema (built once per process: pages ask for it per card)."""
        schemas = _schemas.get(self.name)
        if schemas is None or schemas[0] is not self:
            schemas = (self, {t.name: t.input_schema for t in self.build_tools()})
            _schemas[self.name] = schemas
        return schemas[1].get(tool_name)


_registry: dict[str, Agent] = {}
_schemas: dict[str, tuple[Agent, dict[str, dict[str, Any]]]] = {}
_lock = threading.Lock()


def register(
    name: str,
    *,
    model: Callable[[], Client],
    tools: ToolsArg = (),
    executors: dict[str, Callable[[dict[str, Any]], Any]] | None = None,
    system_prompt: str = "",
    description: str = "",
    allow_typed_output: bool = False,
    replace: bool = False,
) -> Agent:
    if not name or not isinstance(name, str) or len(name) > 100:
        raise ValueError("an agent needs a name of 1 to 100 characters")
    if not callable(model):
        raise TypeError(f"agent {name!r}: model must be a factory returning a toolnexus Client")
    if not callable(tools):
        tools = list(tools)
    agent = Agent(
        name,
        model,
        tools,
        dict(executors or {}),
        system_prompt or "",
        description or "",
        allow_typed_output=bool(allow_typed_output),
    )
    if not callable(tools):
        agent.build_tools()  # fail at registration, not at the first run
    with _lock:
        if name in _registry and not replace:
            raise ValueError(f"an agent named {name!r} is already registered")
        _registry[name] = agent
    return agent


def unregister(name: str) -> None:
    with _lock:
        _registry.pop(name, None)


def get(name: str) -> Agent | None:
    return _registry.get(name)


def require(name: str) -> Agent:
    agent = _registry.get(name)
    if agent is None:
        raise UnknownAgent(f"no agent named {name!r} is registered")
    return agent


def all() -> list[Agent]:
    return sorted(_registry.values(), key=lambda a: a.name)
