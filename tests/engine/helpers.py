"""Shared fakes for the engine checklist tests.

A ``FakeProvider`` plays the model. It is scripted with abstract replies (``say`` /
``calls``) and renders each one in the wire shape of the backend under test:

- ``"openai"``: an ``httpx.MockTransport`` answering ``POST /chat/completions`` with
  a chat.completion JSON body, or an SSE stream when the request asks for ``stream``;
- ``"anthropic"``: the same for ``POST /v1/messages`` (message JSON / Anthropic SSE);
- ``"inprocess"``: a ``generate`` function for ``create_in_process_client``.

Every request body is recorded in ``provider.bodies`` so tests can assert what the model
saw. Nothing here opens a socket.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from toolnexus import (
    Tool,
    ToolResult,
    create_client,
    create_in_process_client,
    create_toolkit,
    pending,
)

BASE_URL = "http://provider.test"
MODEL = "test-model"
HTTP_STYLES = ("openai", "anthropic")
BACKENDS = ("openai", "anthropic", "inprocess")

OBJ: dict[str, Any] = {"type": "object", "properties": {}}
ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
AMOUNT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}},
    "required": ["amount"],
}


def shape(backend: str) -> str:
    """Transcript dialect of a backend: the in-process client is OpenAI-shaped."""
    return "anthropic" if backend == "anthropic" else "openai"


# --------------------------------------------------------------------------------------
# scripted replies
# --------------------------------------------------------------------------------------


@dataclass
class Call:
    id: str
    name: str
    args: dict[str, Any] | str = field(default_factory=dict)

    @property
    def raw(self) -> str:
        """The argument string as the provider sends it (verbatim when given as str)."""
        return self.args if isinstance(self.args, str) else json.dumps(self.args)

    @property
    def input(self) -> dict[str, Any]:
        return json.loads(self.args) if isinstance(self.args, str) else dict(self.args)


@dataclass
class Reply:
    text: str | None = None
    calls: list[Call] = field(default_factory=list)
    usage: tuple[int, int] = (3, 2)


def say(text: str, usage: tuple[int, int] = (3, 2)) -> Reply:
    return Reply(text=text, usage=usage)


def calls(*cs: Call, text: str | None = None, usage: tuple[int, int] = (3, 2)) -> Reply:
    return Reply(text=text, calls=list(cs), usage=usage)


def C(id: str, name: str, args: dict[str, Any] | str | None = None) -> Call:
    return Call(id, name, {} if args is None else args)


# --------------------------------------------------------------------------------------
# wire renderers
# --------------------------------------------------------------------------------------


def _openai_json(r: Reply) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": r.text}
    if r.calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw}}
            for c in r.calls
        ]
    p, q = r.usage
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": msg, "finish_reason": "tool_calls" if r.calls else "stop"}
        ],
        "usage": {"prompt_tokens": p, "completion_tokens": q, "total_tokens": p + q},
    }


def _sse(chunks: Iterable[dict[str, Any]], events: Iterable[str] | None = None) -> bytes:
    out = []
    evs = list(events) if events is not None else None
    for i, ch in enumerate(chunks):
        if evs is not None:
            out.append(f"event: {evs[i]}\n")
        out.append(f"data: {json.dumps(ch)}\n\n")
    return "".join(out).encode()


def _openai_sse(r: Reply) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    if r.text:
        half = max(1, len(r.text) // 2)
        chunks.append(chunk({"content": r.text[:half]}))
        if r.text[half:]:
            chunks.append(chunk({"content": r.text[half:]}))
    for i, c in enumerate(r.calls):
        raw = c.raw
        cut = len(raw) // 2
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": raw[:cut]},
                        }
                    ]
                }
            )
        )
        chunks.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": raw[cut:]}}]}))
    chunks.append(chunk({}, "tool_calls" if r.calls else "stop"))
    p, q = r.usage
    chunks.append(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "model": MODEL,
            "choices": [],
            "usage": {"prompt_tokens": p, "completion_tokens": q, "total_tokens": p + q},
        }
    )
    return _sse(chunks) + b"data: [DONE]\n\n"


def _anthropic_json(r: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if r.text:
        content.append({"type": "text", "text": r.text})
    for c in r.calls:
        content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input})
    p, q = r.usage
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": "tool_use" if r.calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": p, "output_tokens": q},
    }


def _anthropic_sse(r: Reply) -> bytes:
    p, q = r.usage
    evs: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_test",
                    "type": "message",
                    "role": "assistant",
                    "model": MODEL,
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": p, "output_tokens": 0},
                },
            },
        )
    ]
    idx = 0
    if r.text:
        evs.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": idx,
                    "content_block": {"type": "text", "text": ""},
                },
            )
        )
        half = max(1, len(r.text) // 2)
        for piece in (r.text[:half], r.text[half:]):
            if piece:
                evs.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": idx,
                            "delta": {"type": "text_delta", "text": piece},
                        },
                    )
                )
        evs.append(("content_block_stop", {"type": "content_block_stop", "index": idx}))
        idx += 1
    for c in r.calls:
        raw = json.dumps(c.input)
        cut = len(raw) // 2
        evs.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": idx,
                    "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}},
                },
            )
        )
        for piece in (raw[:cut], raw[cut:]):
            evs.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": idx,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    },
                )
            )
        evs.append(("content_block_stop", {"type": "content_block_stop", "index": idx}))
        idx += 1
    evs.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if r.calls else "end_turn"},
                "usage": {"output_tokens": q},
            },
        )
    )
    evs.append(("message_stop", {"type": "message_stop"}))
    return _sse([e[1] for e in evs], [e[0] for e in evs])


# --------------------------------------------------------------------------------------
# the fake provider
# --------------------------------------------------------------------------------------

Step = Reply | httpx.Response | Callable[[dict[str, Any]], "Reply | httpx.Response"]


class FakeProvider:
    """A scripted model. ``script`` entries are consumed in order; ``default`` (if set)
    answers every call after the script runs out; otherwise an extra call fails loudly."""

    def __init__(self, backend: str, *script: Step, default: Step | None = None):
        assert backend in BACKENDS
        self.backend = backend
        self.script: list[Step] = list(script)
        self.default = default
        self.bodies: list[dict[str, Any]] = []
        self.requests: list[httpx.Request] = []

    # -- plumbing ------------------------------------------------------------------
    @property
    def shape(self) -> str:
        return shape(self.backend)

    def _next(self, body: dict[str, Any]) -> Reply | httpx.Response:
        if self.script:
            step = self.script.pop(0)
        elif self.default is not None:
            step = self.default
        else:
            raise AssertionError(f"provider called more often than scripted; body={body!r}")
        if callable(step) and not isinstance(step, (Reply, httpx.Response)):
            step = step(body)
        return step

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(request)
        self.bodies.append(body)
        step = self._next(body)
        if isinstance(step, httpx.Response):
            return step
        if body.get("stream"):
            data = _openai_sse(step) if self.backend == "openai" else _anthropic_sse(step)
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)
        data = _openai_json(step) if self.backend == "openai" else _anthropic_json(step)
        return httpx.Response(200, json=data)

    def generate(self, req: Any) -> dict[str, Any]:
        body = {
            "model": req.model,
            "messages": copy.deepcopy(list(req.messages)),
            "tools": copy.deepcopy(list(req.tools or [])),
        }
        self.bodies.append(body)
        step = self._next(body)
        assert isinstance(step, Reply), "in-process provider only plays Reply steps"
        p, q = step.usage
        return {
            "content": step.text,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.raw} for c in step.calls],
            "usage": {"prompt_tokens": p, "completion_tokens": q, "total_tokens": p + q},
        }

    def http_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))

    def client(self, **opts: Any) -> Any:
        if self.backend == "inprocess":
            opts.setdefault("model", MODEL)
            return create_in_process_client(generate=self.generate, **opts)
        opts.setdefault("model", MODEL)
        opts.setdefault("api_key", "test-key")
        return create_client(
            base_url=BASE_URL, style=self.backend, http_client=self.http_client(), **opts
        )

    # -- what the model saw -------------------------------------------------------
    @property
    def last(self) -> dict[str, Any]:
        return self.bodies[-1]

    def results_seen(self, i: int = -1) -> dict[str, str]:
        """tool-call id -> tool result content, as the model saw it in request ``i``."""
        return {r["id"]: r["content"] for r in tool_results(self.bodies[i]["messages"], self.shape)}


# --------------------------------------------------------------------------------------
# transcript readers (work on plain provider-shaped message dicts)
# --------------------------------------------------------------------------------------


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return "" if content is None else str(content)


def tool_results(messages: list[dict[str, Any]], style: str) -> list[dict[str, Any]]:
    """Every tool result in the transcript, in order: {"id", "content", "is_error"}."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if style == "openai":
            if m.get("role") == "tool":
                out.append(
                    {
                        "id": m.get("tool_call_id"),
                        "content": text_of(m.get("content")),
                        "is_error": None,
                    }
                )
        elif m.get("role") == "user" and isinstance(m.get("content"), list):
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out.append(
                        {
                            "id": b.get("tool_use_id"),
                            "content": text_of(b.get("content")),
                            "is_error": b.get("is_error"),
                        }
                    )
    return out


def result_map(messages: list[dict[str, Any]], style: str) -> dict[str, str]:
    return {r["id"]: r["content"] for r in tool_results(messages, style)}


def result_ids(messages: list[dict[str, Any]], style: str) -> list[str]:
    return [r["id"] for r in tool_results(messages, style)]


def assistant_call_ids(m: dict[str, Any], style: str) -> list[str]:
    if m.get("role") != "assistant":
        return []
    if style == "openai":
        return [tc["id"] for tc in (m.get("tool_calls") or [])]
    content = m.get("content")
    if not isinstance(content, list):
        return []
    return [b["id"] for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def tool_call_ids(messages: list[dict[str, Any]], style: str) -> list[str]:
    out: list[str] = []
    for m in messages:
        out.extend(assistant_call_ids(m, style))
    return out


def assert_balanced(messages: list[dict[str, Any]], style: str) -> None:
    """Every tool-calling assistant turn is followed at once by exactly one result per
    call, in call order (what a provider requires before it accepts the transcript)."""
    for i, m in enumerate(messages):
        ids = assistant_call_ids(m, style)
        if not ids:
            continue
        if style == "openai":
            follow = messages[i + 1 : i + 1 + len(ids)]
            got = [f.get("tool_call_id") for f in follow if f.get("role") == "tool"]
            assert got == ids, f"turn {i}: calls {ids} but results {got}"
            nxt = messages[i + 1 + len(ids)] if i + 1 + len(ids) < len(messages) else None
            assert nxt is None or nxt.get("role") != "tool", f"turn {i}: extra tool message"
        else:
            assert i + 1 < len(messages), f"turn {i}: no tool_result message"
            got = result_ids([messages[i + 1]], "anthropic")
            assert got == ids, f"turn {i}: tool_use {ids} but tool_result {got}"
    assert len(tool_call_ids(messages, style)) == len(tool_results(messages, style))


def user_turns(messages: list[dict[str, Any]], style: str) -> int:
    """User messages that are prompts (not Anthropic tool_result carriers)."""
    n = 0
    for m in messages:
        if m.get("role") != "user":
            continue
        c = m.get("content")
        if isinstance(c, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in c
        ):
            continue
        n += 1
    return n


# --------------------------------------------------------------------------------------
# tools
# --------------------------------------------------------------------------------------


class Probe:
    """A native tool that records every execution (args, ctx)."""

    def __init__(
        self,
        name: str,
        output: str | Callable[[dict[str, Any]], str] = "ok",
        schema: dict[str, Any] | None = None,
        is_error: bool = False,
    ):
        self.name = name
        self.output = output
        self.is_error = is_error
        self.runs: list[tuple[dict[str, Any], Any]] = []
        self.tool = Tool(
            name=name,
            description=f"the {name} tool",
            input_schema=schema or OBJ,
            source="native",
            execute=self.execute,
        )

    async def execute(self, args: dict[str, Any], ctx: Any) -> ToolResult:
        self.runs.append((dict(args or {}), ctx))
        out = self.output(args) if callable(self.output) else self.output
        return ToolResult(output=out, is_error=self.is_error)

    @property
    def count(self) -> int:
        return len(self.runs)


class Gate:
    """A non-relay tool that suspends until it is re-run with an ``ok`` answer; it does
    nothing irreversible before suspending. ``done`` counts the real (answered) runs."""

    def __init__(
        self,
        name: str,
        *,
        kind: str = "authorization",
        prompt: str | None = None,
        url: str | None = None,
        data: dict[str, Any] | None = None,
        expires_at: str | None = None,
    ):
        self.name = name
        self.kind = kind
        self.prompt = prompt or f"{name} needs you"
        self.url = url
        self.data = data
        self.expires_at = expires_at
        self.runs: list[tuple[dict[str, Any], Any]] = []
        self.answers: list[Any] = []
        self.tool = Tool(
            name=name,
            description=f"the {name} gated tool",
            input_schema=OBJ,
            source="native",
            execute=self.execute,
        )

    async def execute(self, args: dict[str, Any], ctx: Any) -> ToolResult:
        self.runs.append((dict(args or {}), ctx))
        answer = getattr(ctx, "answer", None)
        if answer is None:
            return pending(
                kind=self.kind,
                prompt=self.prompt,
                url=self.url,
                data=dict(self.data) if self.data else None,
                expires_at=self.expires_at,
            )
        self.answers.append(answer)
        return ToolResult(output=f"{self.name} done with {json.dumps(answer.data or {})}")

    @property
    def done(self) -> int:
        return len(self.answers)


async def kit(*tools: Any, builtins: Any = False) -> Any:
    """``async with await kit(t1, t2) as tk:`` — a toolkit of these tools."""
    return await create_toolkit(
        builtins=builtins, extra_tools=[getattr(t, "tool", t) for t in tools]
    )


async def collect(aiter: Any) -> list[dict[str, Any]]:
    return [ev async for ev in aiter]


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def field_of(obj: Any, name: str, default: Any = None) -> Any:
    """Read ``name`` from a dict or an object (results whose container type is open)."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)
