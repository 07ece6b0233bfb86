"""The agent registry: hosts register named agents in code (see the project's api.md).

    from approvals import agents
    agents.register("support", model=lambda: create_client(...), tools=lambda: [...],
                    executors={"refund": do_refund}, system_prompt="...", description="...",
                    mcp_servers=[McpServer.stdio("time", "mcp-server-time")])

Every installed app's `agents.py` is imported at start-up, plus the modules named in
settings.TOOLNEXUS_AGENT_MODULES. Keys come from the environment inside `model` factories;
nothing about a model endpoint is stored in the database.

`mcp_servers` are the agent's MCP servers (`toolnexus.mcp.McpServer`s, or configuration
dicts): the worker connects them for each step of a run and closes them at the step's end,
so nothing of a connection outlives a step (a run resumes in any worker). They are either
the same for every run, or picked per run by a callable given the stored run.

`team` makes the agent a team (`toolnexus.agents`): its members are `toolnexus.Agent`s, each
with its own system prompt and a view of the agent's tools (`tools=[names]`), the first one
the coordinator a run starts; a member with a `team` of its own delegates to those members
through the `task` tool. Executors, MCP servers and access rules are the registered agent's,
whichever member calls the tool:

    agents.register("support", model=..., tools=[relay_tool("refund", ...)],
                    executors={"refund": do_refund},
                    team=[Agent("coordinator", system_prompt="...", tools=[], team=["refunds"]),
                          Agent("refunds", system_prompt="...", tools=["refund"])])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolnexus import Client, Tool
from toolnexus.agents import Agent as TeamMember
from toolnexus.agents import Budget
from toolnexus.mcp import McpServer, require_mcp, servers_of

__all__ = [
    "Agent",
    "UnknownAgent",
    "all",
    "get",
    "mcp_server_of_label",
    "mcp_tool_label",
    "register",
    "require",
    "restore",
    "unregister",
]

ToolsArg = Callable[[], Iterable[Tool]] | Iterable[Tool]
# McpServers or configuration dicts (a list, `{name: config}` or `{"mcpServers": {...}}`), or
# a callable given the stored run (a `models.Run`) that returns them.
McpServersArg = Callable[[Any], Any] | Iterable[Any] | Mapping[str, Any] | None


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
    # The agent's MCP servers (see `mcp_servers_for`): a tuple of McpServers, or a callable.
    mcp_servers: tuple[McpServer, ...] | Callable[[Any], Any] = ()
    # A team (see the module's docstring): its members, the coordinator first; () for a
    # single agent. `team_budget` bounds the whole tree of a run.
    team: tuple[TeamMember, ...] = ()
    team_budget: Budget | None = None

    @property
    def coordinator(self) -> str:
        """The team member a run starts ("" for a single agent)."""
        return self.team[0].name if self.team else ""

    def mcp_servers_for(self, run: Any) -> list[McpServer]:
        """The MCP servers one step of `run` connects. A callable is given the stored run
        (read it, do not change it) and must give a run the same servers at every step: a
        resumed call needs the tool names it halted with."""
        if not callable(self.mcp_servers):
            return list(self.mcp_servers)
        return list(normalize_mcp_servers(self.mcp_servers(run), agent=self.name))

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


MCP_LABEL_SEPARATOR = " · "


def mcp_tool_label(server: str, tool: str) -> str:
    """How the record names an MCP server's tool: "time · get_current_time" (the journal of
    executions keeps this name; pages show it)."""
    return f"{server}{MCP_LABEL_SEPARATOR}{tool}" if server else tool


def mcp_server_of_label(label: str) -> str:
    """The server part of an `mcp_tool_label` ("" for the agent's own tools)."""
    server, found, _ = label.partition(MCP_LABEL_SEPARATOR)
    return server if found else ""


def normalize_mcp_servers(value: Any, *, agent: str) -> tuple[McpServer, ...]:
    """McpServers from what `register(mcp_servers=...)` accepts: McpServers, dicts with a
    `name` and the keys of `McpServer.from_dict`, `{name: McpServer | config}`, or the
    common `{"mcpServers": {...}}`. Raises ValueError or TypeError naming the agent."""
    if value is None:
        return ()
    try:
        if isinstance(value, Mapping):
            return tuple(servers_of(value))
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise TypeError("mcp_servers must be McpServers or configuration dicts")
        servers = []
        for spec in value:
            if isinstance(spec, Mapping):
                config = dict(spec)
                name = config.pop("name", None)
                if not isinstance(name, str):
                    raise ValueError("an MCP server's configuration dict needs a name")
                spec = McpServer.from_dict(name, config)
            servers.append(spec)
        return tuple(servers_of(servers))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"agent {agent!r}: {exc}") from None


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
    mcp_servers: McpServersArg = None,
    team: Iterable[TeamMember] | None = None,
    team_budget: Budget | None = None,
    replace: bool = False,
) -> Agent:
    """Register an agent. `mcp_servers`: its MCP servers (McpServers or configuration dicts),
    connected for each step of its runs; or a callable given the stored run that returns
    them (e.g. only for the runs that need a server). Static servers need the `mcp` extra
    at registration already (an ImportError naming it)."""
    if not name or not isinstance(name, str) or len(name) > 100:
        raise ValueError("an agent needs a name of 1 to 100 characters")
    if not callable(model):
        raise TypeError(f"agent {name!r}: model must be a factory returning a toolnexus Client")
    if not callable(tools):
        tools = list(tools)
    servers = (
        mcp_servers if callable(mcp_servers) else normalize_mcp_servers(mcp_servers, agent=name)
    )
    if servers and not callable(servers):
        require_mcp()
    agent = Agent(
        name,
        model,
        tools,
        dict(executors or {}),
        system_prompt or "",
        description or "",
        allow_typed_output=bool(allow_typed_output),
        mcp_servers=servers,
        team=_checked_team(name, team),
        team_budget=team_budget,
    )
    if not callable(tools):
        built = agent.build_tools()  # fail at registration, not at the first run
        _check_team_tools(agent, {t.name for t in built})
    with _lock:
        if name in _registry and not replace:
            raise ValueError(f"an agent named {name!r} is already registered")
        _registry[name] = agent
    return agent


def _checked_team(name: str, team: Iterable[TeamMember] | None) -> tuple[TeamMember, ...]:
    """The members as given, checked: `toolnexus.Agent`s with distinct names whose teams
    name members (ValueError or TypeError naming the agent)."""
    members = tuple(team or ())
    if any(not isinstance(m, TeamMember) for m in members):
        raise TypeError(f"agent {name!r}: team members must be toolnexus.Agent definitions")
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ValueError(f"agent {name!r}: two team members share a name ({names})")
    for member in members:
        unknown = sorted(set(member.team) - set(names))
        if unknown:
            raise ValueError(
                f"agent {name!r}: team member {member.name!r} delegates to unknown {unknown}"
            )
    return members


def _check_team_tools(agent: Agent, tool_names: set[str]) -> None:
    for member in agent.team:
        missing = sorted(set(member.tools or ()) - tool_names)
        if missing:
            raise ValueError(
                f"agent {agent.name!r}: team member {member.name!r} names tools the agent"
                f" lacks: {missing}"
            )


def unregister(name: str) -> None:
    with _lock:
        _registry.pop(name, None)


def restore(name: str, agent: Agent | None) -> None:
    """Put back what `get(name)` returned earlier (None: no agent of that name): for tests
    that override a project's agent for a while."""
    with _lock:
        if agent is None:
            _registry.pop(name, None)
        else:
            _registry[name] = agent


def get(name: str) -> Agent | None:
    return _registry.get(name)


def require(name: str) -> Agent:
    agent = _registry.get(name)
    if agent is None:
        raise UnknownAgent(f"no agent named {name!r} is registered")
    return agent


def all() -> list[Agent]:
    return sorted(_registry.values(), key=lambda a: a.name)
