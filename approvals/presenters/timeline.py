"""The run's transcript as steps a reviewer reads, each tool result next to the decision
that produced it and calls still waiting for one marked."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..domain.jsonvalues import cut_deep
from ..models import ApprovalRequest, RequestCall, Run
from .cards import (
    WAITING_TEXT,
    Outcome,
    QuestionCard,
    _questions,
    answers_of,
    call_outcome,
    mcp_server_of,
)

State = ApprovalRequest.State
RESUMES_TEXT = "Decided: the run resumes with this decision."
NOT_RESUMED_TEXT = "Not carried out: the run was cancelled before it resumed."


@dataclass
class TimelineEntry:
    kind: str  # "system" | "user" | "assistant" | "tool_call" | "tool_result"
    text: str = ""
    name: str = ""
    args: Any = None
    call_id: str = ""
    is_error: bool = False
    decision: RequestCall | None = None
    request: ApprovalRequest | None = None
    outcome: Outcome | None = None
    # The call's request is still open: the transcript holds the engine's placeholder.
    waiting: bool = False
    answers: list[tuple[str, str]] = field(default_factory=list)
    # The MCP server a tool call went to ("" for the agent's own tools).
    server: str = ""
    # The question builtin's call: its questions and options, read as the card reads them
    # (its arguments are a list of objects, which the arguments table shows as raw JSON).
    questions: list[QuestionCard] = field(default_factory=list)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def _question_answers(text: str, request: ApprovalRequest | None) -> list[tuple[str, str]]:
    """A question's result is the answer's data as JSON: read it back as question/answer."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    questions = _questions(request.data) if request is not None else []
    return answers_of(data, questions)


def told_text(told: Mapping[str, Any]) -> str:
    """What an MCP server was told of its question when its run would not resume, and what
    its tool returned (an `mcp_server_told` event's detail), as one sentence."""
    output = str(told.get("output") or "").strip()
    text = f"MCP server “{told.get('server') or '?'}” was told “{told.get('told') or '?'}”"
    return f"{text}; the tool returned: {output}" if output else f"{text}."


def unapplied_text(request: ApprovalRequest, told: Mapping[str, Any] | None = None) -> str:
    """A decided call whose decision is not in the transcript: the run resumes with it, or,
    once the run is cancelled, never will (and its MCP server was told so, when it was)."""
    if request.run.status != Run.Status.CANCELLED:
        return RESUMES_TEXT
    if told is not None and mcp_server_of(request):
        return f"{NOT_RESUMED_TEXT} {told_text(told)}"
    return NOT_RESUMED_TEXT


def timeline(
    messages: list[dict[str, Any]],
    requests: Sequence[ApprovalRequest] = (),
    servers: Mapping[str, str] | None = None,
    told: Mapping[int, Mapping[str, Any]] | None = None,
) -> list[TimelineEntry]:
    """The transcript as readable steps (OpenAI- or Anthropic-shaped), with each tool result
    next to the human decision that produced it, and calls still waiting for one marked.
    `servers`: the MCP server of each call that went to one, by call id; `told`: what MCP
    servers were told of their questions when the run would not resume, by request pk."""
    servers, told = servers or {}, told or {}
    entries: list[TimelineEntry] = []
    names: dict[str, str] = {}
    decided_calls: dict[str, RequestCall] = {}
    waiting_calls: set[str] = set()
    for r in requests:
        for c in r.call_list():
            if r.state == State.PENDING:
                waiting_calls.add(c.call_id)
            else:
                decided_calls[c.call_id] = c

    def result(call_id: str, text: Any, is_error: bool) -> None:
        decision = decided_calls.get(call_id)
        request = decision.request if decision else None
        entry = TimelineEntry(
            "tool_result",
            _content_text(text) if not isinstance(text, str) else text,
            name=names.get(call_id, ""),
            call_id=call_id,
            is_error=is_error,
            decision=decision,
            request=request,
            outcome=call_outcome(request, decision) if request is not None else None,
            waiting=call_id in waiting_calls,
            server=servers.get(call_id, ""),
        )
        if entry.waiting:
            entry.text, entry.is_error = WAITING_TEXT, False
        elif request is not None and request.applied_at is None:
            # Decided, but the worker has not carried it into the transcript (yet, or ever:
            # a cancelled run): what is stored there is still the engine's placeholder.
            entry.text, entry.is_error = unapplied_text(request, told.get(request.pk)), False
        elif entry.name == "question" and not is_error:
            entry.answers = _question_answers(entry.text, request)
        entries.append(entry)

    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if role else None
        if role == "system":
            entries.append(TimelineEntry("system", _content_text(content)))
        elif (
            role == "user"
            and isinstance(content, list)
            and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
        ):
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    result(
                        str(b.get("tool_use_id", "")),
                        b.get("content", ""),
                        b.get("is_error") is True,
                    )
        elif role == "user":
            entries.append(TimelineEntry("user", _content_text(content)))
        elif role == "assistant":
            text = _content_text(content)
            if text:
                entries.append(TimelineEntry("assistant", text))
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                names[tc.get("id", "")] = fn.get("name", "")
                entries.append(
                    TimelineEntry(
                        "tool_call",
                        name=fn.get("name", ""),
                        args=_parse_args(fn.get("arguments")),
                        call_id=tc.get("id", ""),
                        server=servers.get(tc.get("id", ""), ""),
                    )
                )
            for b in content if isinstance(content, list) else []:
                if isinstance(b, dict) and b.get("type") == "tool_use":
                    names[b.get("id", "")] = b.get("name", "")
                    entries.append(
                        TimelineEntry(
                            "tool_call",
                            name=b.get("name", ""),
                            args=_parse_args(b.get("input")),
                            call_id=b.get("id", ""),
                            server=servers.get(b.get("id", ""), ""),
                        )
                    )
        elif role == "tool":
            result(str(m.get("tool_call_id", "")), content, False)
    for entry in entries:
        if entry.kind == "tool_call" and entry.name == "question" and not entry.server:
            entry.questions = _questions(entry.args if isinstance(entry.args, dict) else None)
    return entries


def _parse_args(raw: Any) -> Any:
    """A call's arguments as shown: parsed, and cut where a model nested them too deep."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw else {}
        except (ValueError, RecursionError):
            return raw
    return cut_deep(raw)[0]
