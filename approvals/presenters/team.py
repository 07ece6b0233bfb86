"""A team run's tree of agents for its page: each handle's agent, status, turns, tokens and
its own transcript (with the turn it waits on), nested under the agent that started it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..domain.teams import ROOT, handle_of, handle_status
from ..models import ApprovalRequest
from .timeline import TimelineEntry, timeline

WAITING_FOR_AGENT = "Waiting for {agent}: its result comes back here."


@dataclass
class AgentNode:
    handle: str
    agent: str
    status: str
    turns: int
    tokens: int
    prompt: str
    entries: list[TimelineEntry]
    children: list[AgentNode] = field(default_factory=list)
    asking: bool = False  # its own request is the run's open one

    @property
    def dom_id(self) -> str:
        return "agent-" + self.handle.replace("/", "-").replace(".", "_")


def _waiting_on_child(entries: list[TimelineEntry], handle: Mapping[str, Any], agents) -> None:
    """A parent halted on its `task` call: that call's placeholder says whom it waits for."""
    checkpoint = handle.get("checkpoint") or {}
    awaiting = checkpoint.get("awaiting")
    pending = checkpoint.get("pending") or {}
    call_id = (pending.get("data") or {}).get("callId")
    if not awaiting or not call_id:
        return
    for entry in entries:
        if entry.kind == "tool_result" and entry.call_id == call_id:
            entry.text = WAITING_FOR_AGENT.format(agent=agents.get(awaiting, awaiting))
            entry.waiting, entry.is_error = True, False


def team_tree(
    state: Mapping[str, Any] | None, requests: Sequence[ApprovalRequest]
) -> list[AgentNode]:
    """The top-level handles of a stored runtime state, each with its children (none: a
    single agent's run)."""
    if not state:
        return []
    handles = [h for h in state.get("handles") or [] if isinstance(h, Mapping)]
    conversations = state.get("conversations") or {}
    agents = {h.get("id"): h.get("agent") or "" for h in handles}
    by_handle: dict[str, list[ApprovalRequest]] = {}
    for r in requests:
        by_handle.setdefault(handle_of(r.data), []).append(r)
    open_handle = next(
        (handle_of(r.data) for r in requests if r.state == ApprovalRequest.State.PENDING), ""
    )
    nodes: dict[str, AgentNode] = {}
    for h in handles:
        hid = h.get("id")
        if not isinstance(hid, str) or hid == ROOT:
            continue
        checkpoint = h.get("checkpoint") or {}
        messages = list(conversations.get(hid) or []) + list(checkpoint.get("messages") or [])
        entries = timeline(messages, by_handle.get(hid, ()))
        _waiting_on_child(entries, h, agents)
        nodes[hid] = AgentNode(
            handle=hid,
            agent=h.get("agent") or "",
            status=handle_status(h),
            turns=int(h.get("turns") or 0),
            tokens=int((h.get("usage") or {}).get("total_tokens") or 0),
            prompt=h.get("prompt") or "",
            entries=entries,
            asking=hid == open_handle,
        )
    top: list[AgentNode] = []
    for h in handles:
        node = nodes.get(h.get("id"))
        if node is None:
            continue
        parent = nodes.get(h.get("parent"))
        (parent.children if parent is not None else top).append(node)
    return top
