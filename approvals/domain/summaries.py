"""A request in a few words, as the messages that reach people name it (email, chat, Web
Push, Slack): the tool(s) it asks about and its first arguments, enough to tell requests
apart without opening them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models import ApprovalRequest


def request_what(row: ApprovalRequest) -> str:
    data = row.data if isinstance(row.data, dict) else {}
    if row.kind == "tool_call":
        names = [c.tool_name for c in row.call_list()] or row.relay_tool_names()
        return ", ".join(names) or row.kind
    if row.kind == "approval":
        return str(data.get("tool") or row.kind)
    return row.get_kind_display()


def request_key_arguments(row: ApprovalRequest, limit: int = 3) -> str:
    """The first few arguments, `name=value`, short: enough to tell requests apart."""
    data = row.data if isinstance(row.data, dict) else {}
    if row.kind == "tool_call":
        inputs = [c.input for c in row.call_list()]
    elif row.kind == "approval":
        inputs = [data.get("input")]
    else:
        return " ".join((row.prompt or "").split())[:120]
    parts = []
    for values in inputs:
        if isinstance(values, dict):
            for key, value in list(values.items())[:limit]:
                text = " ".join(str(value).split())
                parts.append(f"{key}={text[:40] + '…' if len(text) > 40 else text}")
    return ", ".join(parts)
