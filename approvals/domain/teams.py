"""Team runs, read from their data alone: where a request came from in the tree of agents
(its `data.path`) and each handle of a stored runtime state (`Run.team_state`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

ROOT = "root"
_COUNTED = re.compile(r"^(?P<agent>.+)\.\d+$")


def agent_of_segment(segment: str) -> str:
    """ "refunds.2" -> "refunds" (a handle's last segment: the agent and its spawn count)."""
    found = _COUNTED.match(segment)
    return found.group("agent") if found else segment


def chain_of(data: Any) -> list[str]:
    """The agents a request climbed from, top first (["coordinator", "refunds"]), from its
    `data.path` (["root", "coordinator.1", "refunds.1"]); [] for a single agent's request or
    a path that is not a list of strings."""
    path = data.get("path") if isinstance(data, Mapping) else None
    if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
        return []
    return [agent_of_segment(p) for p in path if p != ROOT]


def handle_of(data: Any) -> str:
    """The asking handle's id ("root/coordinator.1/refunds.1"), or ""."""
    path = data.get("path") if isinstance(data, Mapping) else None
    if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
        return ""
    return "/".join(path)


def handle_status(handle: Mapping[str, Any]) -> str:
    """What a saved handle is doing or how it ended, in a word: "waiting" (suspended),
    "running", or its outcome's status ("done", "incomplete", "error", ...)."""
    state = handle.get("state")
    if state == "suspended":
        return "waiting"
    if state == "running":
        return "running"
    outcome = handle.get("outcome") or {}
    return str(outcome.get("status") or state or "idle")


def agent_tree(state: Any) -> list[dict[str, Any]]:
    """A stored runtime state's handles as a tree, top-level handles first, each
    `{handle, agent, status, turns, tokens, children}` (turns and tokens its own, as the run
    page shows them); [] for a single agent's run or a state that is not one."""
    handles = state.get("handles") if isinstance(state, Mapping) else None
    if not isinstance(handles, list):
        return []
    nodes: dict[str, dict[str, Any]] = {}
    parents: dict[str, Any] = {}
    for h in handles:
        hid = h.get("id") if isinstance(h, Mapping) else None
        if not isinstance(hid, str) or hid == ROOT:
            continue
        usage = h.get("usage") if isinstance(h.get("usage"), Mapping) else {}
        nodes[hid] = {
            "handle": hid,
            "agent": str(h.get("agent") or ""),
            "status": handle_status(h),
            "turns": int(h.get("turns") or 0),
            "tokens": int(usage.get("total_tokens") or 0),
            "children": [],
        }
        parents[hid] = h.get("parent")
    top: list[dict[str, Any]] = []
    for hid, node in nodes.items():  # in the order the handles were started
        parent = nodes.get(parents[hid])
        (parent["children"] if parent is not None else top).append(node)
    return top
