"""What a request card shows, worked out once per render from the row and its agent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import agents
from .models import ApprovalRequest, RequestCall
from .schema_forms import SchemaField, fields_for

State = ApprovalRequest.State
KIND_LABELS = {
    "tool_call": "tool call",
    "approval": "approval",
    "question": "question",
    "input": "input",
    "authorization": "sign-in",
}


@dataclass
class CallCard:
    call: RequestCall
    has_executor: bool
    fields: list[SchemaField]


@dataclass
class QuestionCard:
    index: int
    text: str
    header: str
    options: list[str]


@dataclass
class RequestCard:
    row: ApprovalRequest
    can_decide: bool
    calls: list[CallCard] = field(default_factory=list)
    questions: list[QuestionCard] = field(default_factory=list)
    input_fields: list[SchemaField] = field(default_factory=list)
    message: str = ""
    level: str = "info"

    @property
    def title(self) -> str:
        return request_title(self.row, [c.call.tool_name for c in self.calls])

    @property
    def kind_label(self) -> str:
        return KIND_LABELS.get(self.row.kind, self.row.kind)

    @property
    def is_pending(self) -> bool:
        return self.row.state == State.PENDING

    @property
    def dom_id(self) -> str:
        return f"request-{self.row.pk}"

    @property
    def multi(self) -> bool:
        return len(self.calls) > 1

    @property
    def approval_input(self) -> dict[str, Any]:
        data = self.row.data or {}
        return data.get("input") if isinstance(data.get("input"), dict) else {}


def request_title(row: ApprovalRequest, tool_names: Sequence[str]) -> str:
    """A human headline: relay prompts are machine text ("relay tool call x to ...")."""
    if row.kind == "tool_call" and tool_names:
        names = list(tool_names)
        joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        return f"The agent wants to run {joined}"
    return row.prompt


def _questions(data: dict[str, Any] | None) -> list[QuestionCard]:
    out = []
    for i, q in enumerate((data or {}).get("questions") or []):
        if not isinstance(q, dict):
            continue
        options = [
            o.get("label", "") if isinstance(o, dict) else str(o) for o in q.get("options") or []
        ]
        out.append(QuestionCard(i, str(q.get("question", "")), str(q.get("header", "")), options))
    return out


def request_card(
    row: ApprovalRequest, *, can_decide: bool, message: str = "", level: str = "info"
) -> RequestCard:
    agent = agents.get(row.agent)
    card = RequestCard(row=row, can_decide=can_decide, message=message, level=level)
    for call in row.calls.all():
        schema = agent.tool_schema(call.tool_name) if agent else None
        card.calls.append(
            CallCard(
                call,
                bool(agent and agent.executor_for(call.tool_name)),
                fields_for(schema, call.input),
            )
        )
    if row.kind == "question":
        card.questions = _questions(row.data)
    schema = (row.data or {}).get("schema")
    if row.kind not in ("tool_call", "approval", "question") and isinstance(schema, dict):
        card.input_fields = fields_for(schema, {})
    return card


# -- run timeline --------------------------------------------------------------------------


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


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def timeline(
    messages: list[dict[str, Any]], decided_calls: dict[str, RequestCall]
) -> list[TimelineEntry]:
    """The transcript as readable steps (OpenAI- or Anthropic-shaped), with each tool result
    next to the human decision that produced it."""
    entries: list[TimelineEntry] = []
    names: dict[str, str] = {}

    def result(call_id: str, text: Any, is_error: bool) -> None:
        decision = decided_calls.get(call_id)
        entries.append(
            TimelineEntry(
                "tool_result",
                _content_text(text) if not isinstance(text, str) else text,
                name=names.get(call_id, ""),
                call_id=call_id,
                is_error=is_error,
                decision=decision,
                request=decision.request if decision else None,
            )
        )

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
                    )
                )
            for b in content if isinstance(content, list) else []:
                if isinstance(b, dict) and b.get("type") == "tool_use":
                    names[b.get("id", "")] = b.get("name", "")
                    entries.append(
                        TimelineEntry(
                            "tool_call",
                            name=b.get("name", ""),
                            args=b.get("input"),
                            call_id=b.get("id", ""),
                        )
                    )
        elif role == "tool":
            result(str(m.get("tool_call_id", "")), content, False)
    return entries


def _parse_args(raw: Any) -> Any:
    import json

    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return raw
    return raw
