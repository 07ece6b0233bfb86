"""The in-process model: a Python function plays the model, with no URL and no socket.

`generate(request)` (sync or async) receives an `InProcessRequest` and returns an
`InProcessResponse`, a dict with the same keys, or a plain string. Its reply is turned into
an OpenAI chat-completion reply, so the in-process transcript is OpenAI-shaped.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .dialects import OPENAI, ModelTurn
from .model_http import with_retries
from .types import ModelError

__all__ = [
    "InProcessModel",
    "InProcessRequest",
    "InProcessResponse",
    "InProcessToolCall",
    "reply_of",
]

_COMPACT = (",", ":")
_WORD = re.compile(r"\s*\S+|\s+$")  # a word with the whitespace before it (joined: the text)


@dataclass(slots=True)
class InProcessToolCall:
    id: str | None
    name: str
    arguments: Any = None


@dataclass(slots=True)
class InProcessResponse:
    content: str | None = None
    tool_calls: list[Any] = field(default_factory=list)
    usage: dict[str, Any] | None = None


@dataclass(slots=True)
class InProcessRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    model: str
    body: dict[str, Any]


def reply_of(response: Any) -> dict[str, Any]:
    """Turn what a `generate` function returned into an OpenAI chat-completion reply."""
    if isinstance(response, InProcessResponse):
        content, calls, usage = response.content, response.tool_calls, response.usage
    elif isinstance(response, Mapping):
        content = response.get("content")
        calls = response.get("tool_calls", response.get("toolCalls")) or []
        usage = response.get("usage")
    elif isinstance(response, str):
        content, calls, usage = response, [], None
    else:
        raise ModelError(f"generate returned {type(response).__name__}, not an InProcessResponse")
    tool_calls = []
    for i, call in enumerate(calls or []):
        if isinstance(call, InProcessToolCall):
            cid, name, arguments = call.id, call.name, call.arguments
        elif isinstance(call, Mapping):
            cid, name, arguments = call.get("id"), call.get("name"), call.get("arguments")
        else:
            raise ModelError(f"generate returned a tool call of type {type(call).__name__}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {}, separators=_COMPACT)
        tool_calls.append(
            {
                "id": cid or f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    reply: dict[str, Any] = {
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ]
    }
    if isinstance(usage, Mapping):
        prompt = usage.get("prompt_tokens", usage.get("promptTokens", 0)) or 0
        completion = usage.get("completion_tokens", usage.get("completionTokens", 0)) or 0
        total = usage.get("total_tokens", usage.get("totalTokens", 0)) or prompt + completion
        reply["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": total,
        }
    return reply


class InProcessModel:
    """The model backend of `create_in_process_client`: one call of `generate` per turn.

    A failing `generate` is a retryable `ModelError`, retried only when `retries` is given.
    `word_delay` (seconds): a streamed turn's text is emitted word by word, this long apart,
    as a model generating it would (a demo that visibly streams); 0 emits it whole.
    """

    dialect = OPENAI
    streams = False  # text arrives whole: the loop emits it as one delta

    def __init__(
        self,
        generate: Callable[[InProcessRequest], Any],
        *,
        model: str,
        retries: int = 0,
        retry_base_ms: float = 500,
        word_delay: float = 0.0,
    ) -> None:
        self.generate = generate
        self.word_delay = max(0.0, word_delay)
        self.model = model
        self.retries = max(0, retries)
        self.retry_base = retry_base_ms / 1000

    async def complete(
        self, body: dict[str, Any], emit: Callable[[dict[str, Any]], None] | None
    ) -> ModelTurn:
        if self.retries:
            turn = await with_retries(lambda: self._turn(body), self.retries, self.retry_base)
        else:
            turn = await self._turn(body)
        if emit is not None and turn.text:
            if self.word_delay <= 0:
                emit({"type": "text", "delta": turn.text})
                return turn
            for i, word in enumerate(_WORD.findall(turn.text)):
                if i:
                    await asyncio.sleep(self.word_delay)
                emit({"type": "text", "delta": word})
        return turn

    async def _turn(self, body: dict[str, Any]) -> ModelTurn:
        request = InProcessRequest(
            messages=body["messages"], tools=body.get("tools") or [], model=self.model, body=body
        )
        try:
            reply = self.generate(request)
            if inspect.isawaitable(reply):
                reply = await reply
        except (asyncio.CancelledError, ModelError):
            raise
        except Exception as exc:
            raise ModelError(
                f"generate failed: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        return OPENAI.parse(reply_of(reply))

    async def aclose(self) -> None:
        """Nothing to release: no connection."""
