"""Provider dialects: how OpenAI- and Anthropic-style APIs shape bodies, replies and transcripts.

The loop in `loop.py` is dialect-free; everything that depends on the wire shape of a
provider lives here, so the halt/resume rules are written once for both. A reply that cannot
be parsed is a `ModelError` that is not retried: the endpoint answered, so it may have acted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .types import ModelError, ToolResult

__all__ = ["ANTHROPIC", "OPENAI", "Call", "Dialect", "ModelTurn"]

_COMPACT = (",", ":")


@dataclass(slots=True)
class Call:
    """One tool call of a model turn."""

    id: str
    name: str
    args: dict[str, Any]
    raw: str | None  # the provider's raw argument string, when it sent one
    error: str | None = None  # why the arguments could not be used


@dataclass(slots=True)
class ModelTurn:
    message: dict[str, Any]  # the assistant message, as it goes into the transcript
    text: str
    calls: list[Call]
    usage: dict[str, int] = field(default_factory=dict)
    raw: Any = None  # the provider's response, for after_llm hooks


def _parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None, str | None]:
    """(args, raw string, error) from what a provider sent as a call's arguments."""
    if raw is None or raw == "":
        return {}, raw if isinstance(raw, str) else None, None
    if isinstance(raw, dict):
        return raw, json.dumps(raw, separators=_COMPACT, ensure_ascii=False), None
    if not isinstance(raw, str):
        return {}, None, f"arguments must be a JSON object, got {type(raw).__name__}"
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return {}, raw, f"arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(value, dict):
        return {}, raw, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, raw, None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class Dialect:
    name: str

    def start_messages(
        self, system: str, history: list[dict[str, Any]] | None, prompt: str
    ) -> list[dict[str, Any]]:
        raise NotImplementedError

    def body(
        self,
        model: str,
        system: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        stream: bool,
    ) -> dict[str, Any]:
        raise NotImplementedError

    def tools_of(self, toolkit: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def parse(self, data: Any) -> ModelTurn:
        raise NotImplementedError

    def result_messages(self, records: Iterable[tuple[Call, ToolResult]]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def halted_turn(self, messages: list[dict[str, Any]]) -> tuple[int, list[Call]] | None:
        """Index and calls of the last assistant message that called tools."""
        raise NotImplementedError

    def recorded_results(self, messages: list[dict[str, Any]], after: int) -> dict[str, ToolResult]:
        """Tool results already in the transcript after message `after`, by call id."""
        raise NotImplementedError

    def new_stream_state(self) -> Any:
        raise NotImplementedError

    def text_of(self, message: Any) -> str:
        raise NotImplementedError

    def is_final_reply(self, message: Any) -> bool:
        """True for an assistant message that called no tools: the run's answer."""
        return (
            isinstance(message, dict)
            and message.get("role") == "assistant"
            and self.halted_turn([message]) is None
        )

    def open_turn(self, messages: list[dict[str, Any]]) -> int | None:
        """Index of a trailing assistant turn that still lacks results for some calls."""
        found = self.halted_turn(messages)
        if found is None:
            return None
        index, calls = found
        if any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages[index + 1 :]):
            return None
        recorded = self.recorded_results(messages, index)
        return index if any(c.id not in recorded for c in calls) else None


# -- OpenAI ---------------------------------------------------------------------------------


class _OpenAI(Dialect):
    name = "openai"

    def start_messages(self, system, history, prompt):
        messages: list[dict[str, Any]] = []
        if history:
            messages.extend(history)
        elif system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        return messages

    def body(self, model, system, messages, tools, stream):
        body: dict[str, Any] = {"model": model, "messages": messages}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def tools_of(self, toolkit):
        return toolkit.to_openai()

    def parse(self, data):
        try:
            message = data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise ModelError("model reply has no choices[0].message") from None
        if not isinstance(message, dict):
            raise ModelError("model reply's message is not an object")
        message = dict(message)
        message.setdefault("role", "assistant")
        text = message.get("content")
        calls = self._calls(message.get("tool_calls"))
        usage = data.get("usage") if isinstance(data, dict) else None
        return ModelTurn(
            message=message,
            text=text if isinstance(text, str) else "",
            calls=calls,
            usage=self._usage(usage),
            raw=data,
        )

    @staticmethod
    def _usage(usage: Any) -> dict[str, int]:
        if not isinstance(usage, dict):
            return {}
        prompt = _int(usage.get("prompt_tokens"))
        completion = _int(usage.get("completion_tokens"))
        total = _int(usage.get("total_tokens")) or prompt + completion
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}

    @staticmethod
    def _calls(tool_calls: Any) -> list[Call]:
        calls: list[Call] = []
        if not isinstance(tool_calls, list):
            return calls
        for i, tc in enumerate(tool_calls):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict):
                continue
            args, raw, error = _parse_arguments(fn.get("arguments"))
            calls.append(
                Call(
                    id=str(tc.get("id") or f"call_{i}"),
                    name=str(fn.get("name") or ""),
                    args=args,
                    raw=raw,
                    error=error,
                )
            )
        return calls

    def result_messages(self, records):
        return [
            {"role": "tool", "tool_call_id": call.id, "content": result.output}
            for call, result in records
        ]

    def halted_turn(self, messages):
        for index in range(len(messages) - 1, -1, -1):
            m = messages[index]
            if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls"):
                return index, self._calls(m["tool_calls"])
        return None

    def recorded_results(self, messages, after):
        found: dict[str, ToolResult] = {}
        for m in messages[after + 1 :]:
            if isinstance(m, dict) and m.get("role") == "tool" and m.get("tool_call_id"):
                content = m.get("content")
                # OpenAI tool messages carry no error flag; the text is what the model saw.
                found[m["tool_call_id"]] = ToolResult(
                    content if isinstance(content, str) else json.dumps(content)
                )
        return found

    def new_stream_state(self):
        return _OpenAIStream()

    def text_of(self, message):
        content = message.get("content") if isinstance(message, dict) else None
        return content if isinstance(content, str) else ""


class _OpenAIStream:
    """Assembles an OpenAI SSE stream into a ModelTurn."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, int] = {}

    def feed(self, chunk: dict[str, Any]) -> str | None:
        if isinstance(chunk.get("usage"), dict):
            self.usage = _OpenAI._usage(chunk["usage"])
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            return None
        delta = choices[0].get("delta") if isinstance(choices[0], dict) else None
        if not isinstance(delta, dict):
            return None
        for tc in delta.get("tool_calls") or []:
            slot = self.calls.setdefault(
                tc.get("index", len(self.calls)), {"id": "", "name": "", "arguments": ""}
            )
            if tc.get("id"):
                slot["id"] = tc["id"]
            fn = tc.get("function") or {}
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""
        piece = delta.get("content")
        if isinstance(piece, str) and piece:
            self.text.append(piece)
            return piece
        return None

    def finish(self) -> ModelTurn:
        text = "".join(self.text)
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        tool_calls = [
            {
                "id": c["id"] or f"call_{i}",
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for i, c in (sorted(self.calls.items()))
        ]
        if tool_calls:
            message["tool_calls"] = tool_calls
        return ModelTurn(
            message=message,
            text=text,
            calls=_OpenAI._calls(tool_calls),
            usage=self.usage,
            raw={"streamed": True, "usage": self.usage},
        )


# -- Anthropic ------------------------------------------------------------------------------


class _Anthropic(Dialect):
    name = "anthropic"
    max_tokens = 4096

    def start_messages(self, system, history, prompt):
        return [*(history or []), {"role": "user", "content": prompt}]

    def body(self, model, system, messages, tools, stream):
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens}
        if system:
            body["system"] = system
        body["messages"] = messages
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
        return body

    def tools_of(self, toolkit):
        return toolkit.to_anthropic()

    def parse(self, data):
        content = data.get("content") if isinstance(data, dict) else None
        if not isinstance(content, list):
            raise ModelError("model reply has no content list")
        message = {"role": "assistant", "content": content}
        usage = data.get("usage")
        return ModelTurn(
            message=message,
            text=self._text(content),
            calls=self._calls(content),
            usage=self._usage(usage),
            raw=data,
        )

    @staticmethod
    def _text(content: list[Any]) -> str:
        return "".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )

    @staticmethod
    def _usage(usage: Any) -> dict[str, int]:
        if not isinstance(usage, dict):
            return {}
        prompt = _int(usage.get("input_tokens"))
        completion = _int(usage.get("output_tokens"))
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    @staticmethod
    def _calls(content: Any) -> list[Call]:
        calls: list[Call] = []
        if not isinstance(content, list):
            return calls
        for i, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "tool_use":
                raw_input = block.get("input")
                args, raw, error = _parse_arguments(raw_input if raw_input is not None else {})
                calls.append(
                    Call(
                        id=str(block.get("id") or f"call_{i}"),
                        name=str(block.get("name") or ""),
                        args=args,
                        raw=raw,
                        error=error,
                    )
                )
        return calls

    def result_messages(self, records):
        blocks = [
            {
                "type": "tool_result",
                "tool_use_id": call.id,
                "content": result.output,
                "is_error": bool(result.is_error),
            }
            for call, result in records
        ]
        return [{"role": "user", "content": blocks}] if blocks else []

    def halted_turn(self, messages):
        for index in range(len(messages) - 1, -1, -1):
            m = messages[index]
            if isinstance(m, dict) and m.get("role") == "assistant":
                calls = self._calls(m.get("content"))
                if calls:
                    return index, calls
        return None

    def recorded_results(self, messages, after):
        found: dict[str, ToolResult] = {}
        for m in messages[after + 1 :]:
            content = m.get("content") if isinstance(m, dict) and m.get("role") == "user" else None
            if not isinstance(content, list):
                continue
            for block in content:
                if (
                    isinstance(block, dict)
                    and block.get("type") == "tool_result"
                    and block.get("tool_use_id")
                ):
                    out = block.get("content")
                    if isinstance(out, list):  # content blocks: keep their text
                        out = "".join(b.get("text", "") for b in out if isinstance(b, dict))
                    found[block["tool_use_id"]] = ToolResult(
                        out if isinstance(out, str) else "", is_error=block.get("is_error") is True
                    )
        return found

    def new_stream_state(self):
        return _AnthropicStream()

    def text_of(self, message):
        content = message.get("content") if isinstance(message, dict) else None
        return self._text(content) if isinstance(content, list) else ""


class _AnthropicStream:
    """Assembles an Anthropic SSE stream into a ModelTurn."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, list[str]] = {}
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}

    def _add_usage(self, usage: Any) -> None:
        u = _Anthropic._usage(usage)
        for key in self.usage:
            self.usage[key] += u.get(key, 0)

    def feed(self, event: dict[str, Any]) -> str | None:
        kind = event.get("type")
        if kind == "message_start":
            self._add_usage((event.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            if block.get("type") == "tool_use":
                block["input"] = {}
            elif block.get("type") == "text":
                block["text"] = block.get("text", "")
            self.blocks[event.get("index", len(self.blocks))] = block
        elif kind == "content_block_delta":
            index = event.get("index", 0)
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                piece = delta.get("text", "")
                block = self.blocks.setdefault(index, {"type": "text", "text": ""})
                block["text"] = block.get("text", "") + piece
                return piece or None
            if delta.get("type") == "input_json_delta":
                self.partial.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "message_delta":
            self._add_usage(event.get("usage"))
        elif kind == "error":
            raise ModelError(
                f"model stream error: {json.dumps(event.get('error'))}", retryable=False
            )
        return None

    def finish(self) -> ModelTurn:
        content: list[dict[str, Any]] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.get("type") == "tool_use":
                raw = "".join(self.partial.get(index, []))
                try:
                    block["input"] = json.loads(raw) if raw else {}
                except ValueError:
                    block["input"] = raw  # surfaces as an argument error for this call
            content.append(block)
        return ModelTurn(
            message={"role": "assistant", "content": content},
            text=_Anthropic._text(content),
            calls=_Anthropic._calls(content),
            usage=dict(self.usage),
            raw={"streamed": True, "usage": self.usage},
        )


OPENAI = _OpenAI()
ANTHROPIC = _Anthropic()
