"""The demo agent's MCP server: a restaurant's booking service, written with the `mcp` SDK.

Run over stdio: `python -m approvals.agents.demo_mcp_server` (the demo agent declares it so;
it needs the `mcp` extra, nothing of Django). Its one tool, `book_table`, asks who the table
is for (an MCP elicitation: a form of party size and name) before it books, so a demo run
halts with a question of this server in the inbox. What the answer was reaches the tool's
result: "Booked ... under Ada", or "No table booked: the guest said decline" / "cancel".

`TOOLNEXUS_DEMO_MCP_LOG` (optional) names a file that receives one JSON line per event
(start, call, cancelled, answer), so tests can tell what the server saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import zlib
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field

LOG_ENV = "TOOLNEXUS_DEMO_MCP_LOG"
QUESTION = "Who is the table for? The restaurant needs the party size and a name."

server = MCPServer("tables")


class Guests(BaseModel):
    party_size: int = Field(title="Party size", ge=1, le=12, description="1 to 12 guests")
    name: str = Field(title="Name on the booking", min_length=1, max_length=80)


def log(event: str, **fields: Any) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


@server.tool()
async def book_table(ctx: Context, restaurant: str = "Trattoria Demo", time: str = "19:30") -> str:
    """Book a table at a restaurant (asks who it is for before booking)."""
    log("call", tool="book_table", restaurant=restaurant, time=time)
    try:
        result = await ctx.elicit(QUESTION, Guests)
    except asyncio.CancelledError:  # the call was halted: the question waits for a reviewer
        log("cancelled", tool="book_table")
        raise
    content = result.data.model_dump() if result.action == "accept" else None
    log("answer", tool="book_table", action=result.action, content=content)
    if result.action != "accept":
        return f"No table booked at {restaurant}: the guest said {result.action}."
    guests = result.data
    # The same booking gets the same number, however often the call is replayed.
    number = zlib.crc32(json.dumps([restaurant, time, content], sort_keys=True).encode())
    return (
        f"Booked a table for {guests.party_size} at {restaurant}, {time}, under "
        f"{guests.name} (confirmation T-{number % 100000:05d})."
    )


def main() -> None:
    log("start", transport="stdio", argv=sys.argv[1:])
    server.run()


if __name__ == "__main__":
    main()
