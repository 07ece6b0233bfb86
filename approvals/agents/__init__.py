"""The agent registry: hosts register named agents in code (see the project's api.md).

from approvals import agents
agents.register("support", model=lambda: create_client(...), tools=lambda: [...],
                executors={"refund": do_refund}, system_prompt="...", description="...",
                mcp_servers=[McpServer.stdio("time", "mcp-server-time")])
"""

from .registry import (
    MCP_LABEL_SEPARATOR,
    Agent,
    UnknownAgent,
    all,
    get,
    mcp_server_of_label,
    mcp_tool_label,
    register,
    require,
    restore,
    unregister,
)

__all__ = [
    "MCP_LABEL_SEPARATOR",
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
