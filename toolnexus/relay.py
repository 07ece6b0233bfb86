"""Relay tools: declared to the model, executed by the host.

A relay tool does nothing itself. Its first call suspends with a `kind:"tool_call"` request
carrying the call (`data.calls`); the host runs it wherever it likes and answers with the
output. Declines and failures come back to the model as error tool results, never as an
aborted run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .texts import DEFAULT_REASON, no_result_on_resume, relay_prompt
from .texts import relay_declined as decline_text
from .types import Answer, Request, Tool, ToolContext, ToolResult, pending

__all__ = [
    "RELAY_KIND",
    "RELAY_SOURCE",
    "RelayCall",
    "RelayResult",
    "answer_declined",
    "answer_output",
    "decline_text",
    "is_relay_request",
    "relay_answer",
    "relay_calls_of",
    "relay_prompt",
    "relay_result_for",
    "relay_tool",
]

RELAY_KIND = "tool_call"
RELAY_SOURCE = "relay"


@dataclass(slots=True)
class RelayCall:
    id: str
    name: str
    input: dict[str, Any]
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "input": self.input, "arguments": self.arguments}


@dataclass(slots=True)
class RelayResult:
    id: str
    output: str
    is_error: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "output": self.output, "isError": self.is_error}


def relay_tool(name: str, description: str, input_schema: dict[str, Any] | None = None) -> Tool:
    """A tool the model can call but the host executes (see module docstring)."""

    def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        answer = ctx.answer if ctx else None
        if answer is None:
            call_id = (ctx.call_id if ctx else None) or ""
            raw = ctx.arguments if ctx and ctx.arguments is not None else _encode(args)
            call = RelayCall(id=call_id, name=name, input=dict(args or {}), arguments=raw)
            return pending(
                kind=RELAY_KIND, prompt=relay_prompt(name), data={"calls": [call.to_dict()]}
            )
        if not answer.ok:
            return ToolResult(decline_text(name, answer.reason), is_error=True)
        return relay_result_for(answer, ctx.call_id if ctx else None, first=True) or ToolResult(
            no_result_on_resume(name), is_error=True
        )

    return Tool(
        name=name,
        description=description,
        input_schema=input_schema or {"type": "object", "properties": {}},
        source=RELAY_SOURCE,
        execute=execute,
    )


def _encode(args: Any) -> str:
    return json.dumps(args if args is not None else {}, separators=(",", ":"), ensure_ascii=False)


def _output_text(value: Any) -> str:
    # Readers are lenient: a non-string output is shown to the model as JSON, never dropped.
    if value is None:
        return ""
    return value if isinstance(value, str) else _encode(value)


def relay_result_for(answer: Answer, call_id: str | None, *, first: bool) -> ToolResult | None:
    """The host's result for one relayed call: from `data.results` by call id, else the
    one-call shorthand (`data.output` / `data.isError`) when `first` is true."""
    data = answer.data or {}
    results = data.get("results")
    if isinstance(results, list) and call_id:
        for entry in results:
            if isinstance(entry, Mapping) and entry.get("id") == call_id:
                return ToolResult(
                    _output_text(entry.get("output")), is_error=entry.get("isError") is True
                )
    if first and "output" in data:
        return ToolResult(_output_text(data.get("output")), is_error=data.get("isError") is True)
    return None


def answer_output(id: str, output: str, *, is_error: bool = False) -> Answer:
    """The answer carrying a relayed call's output (`is_error` when the host's tool failed)."""
    data: dict[str, Any] = {"output": output}
    if is_error:
        data["isError"] = True
    return Answer(id=id, ok=True, data=data)


def answer_declined(id: str, reason: str = "") -> Answer:
    """The answer for a refused request; an empty reason becomes "declined"."""
    return Answer(id=id, ok=False, data=None, reason=reason or DEFAULT_REASON)


def relay_answer(id: str, results: Iterable[RelayResult]) -> Answer:
    """The answer carrying one result per relayed call, matched to calls by call id."""
    return Answer(id=id, ok=True, data={"results": [r.to_dict() for r in results]})


def is_relay_request(request: Request | None) -> bool:
    return request is not None and request.kind == RELAY_KIND


def relay_calls_of(request: Request | None) -> list[RelayCall]:
    if not is_relay_request(request):
        return []
    calls = (request.data or {}).get("calls")
    out: list[RelayCall] = []
    if not isinstance(calls, list):
        return out
    for c in calls:
        if not isinstance(c, Mapping):
            continue
        raw_input = c.get("input")
        inp = dict(raw_input) if isinstance(raw_input, Mapping) else {}
        arguments = c.get("arguments")
        out.append(
            RelayCall(
                id=str(c.get("id") or ""),
                name=str(c.get("name") or ""),
                input=inp,
                arguments=arguments if isinstance(arguments, str) else _encode(inp),
            )
        )
    return out
