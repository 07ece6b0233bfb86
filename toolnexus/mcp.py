"""MCP servers as tool sources, and the MCP elicitation bridge (the public module).

- `McpServer` declares a server (a stdio command, or an HTTP URL) for
  `create_toolkit(mcp_servers=...)`; the toolkit connects, lists its tools and calls them
  (the connection code is `toolnexus.mcp_client`, imported only when servers are declared).
- `elicitation_to_request` / `answer_to_elicit_result`: an MCP `elicitation/create` as a
  toolnexus `Request`, and a toolnexus `Answer` as the SDK's `ElicitResult`
  (accept / decline / cancel); `elicit_action` names which, without the SDK.
- `elicitation_errors`: what is wrong with an answer's content for a halted elicitation.
- `answer_elicitation`: give a server the answer to its question outside any run (a run
  that will not resume: the server hears `cancel`).

The declarations and the bridge live in `toolnexus.mcp_spec`, below this module and
`toolnexus.mcp_client` alike: this module imports the connection code (lazily), never the
other way round. The official `mcp` SDK is an optional extra (`toolnexus-web[mcp]`): this
module imports without it, and anything that needs it raises an `ImportError` naming the
extra.
"""

from __future__ import annotations

from typing import Any

from .mcp_spec import (
    DECLINE_REASON,
    ELICITATION_KIND,
    MCP_EXTRA_HINT,
    McpServer,
    McpServerError,
    answer_to_elicit_result,
    elicit_action,
    elicitation_errors,
    elicitation_to_request,
    require_mcp,
    resolve_command,
    servers_of,
)
from .types import Answer, Request

__all__ = [
    "DECLINE_REASON",
    "ELICITATION_KIND",
    "MCP_EXTRA_HINT",
    "McpServer",
    "McpServerError",
    "answer_elicitation",
    "answer_to_elicit_result",
    "elicit_action",
    "elicitation_errors",
    "elicitation_to_request",
    "require_mcp",
    "resolve_command",
    "servers_of",
]


async def answer_elicitation(servers: Any, request: Request, answer: Answer) -> Any:
    """Give the MCP server whose question halted a call the `answer`, outside any run.

    For a run that will not resume (cancelled): at the halt the server's call was cancelled;
    this starts that server alone (`servers` as for `create_toolkit`), replays the call with
    the same arguments and gives the replayed question `answer` (a refusal: `decline` for
    reason "declined", else `cancel`), then stops the server. Returns the tool's
    `ToolResult` (no model reads it); a server that cannot start or a call that fails is an
    error result, nothing is raised for them. The assumption of every replay holds: the tool
    does nothing irreversible before it asks.
    """
    require_mcp()
    from .mcp_client import answer_halted  # needs the optional `mcp` SDK

    return await answer_halted(servers_of(servers), request, answer)
