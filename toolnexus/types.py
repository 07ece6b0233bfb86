"""Core engine types: tools, results, suspension requests and answers.

`Request` and `Answer` are wire types: their JSON is byte-identical across the toolnexus
ports (keys in a fixed order, empty optional keys omitted), so a host can store them and a
process in any language can resume the run.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "Answer",
    "ModelError",
    "Request",
    "ResumeError",
    "RunCancelled",
    "RunResult",
    "RunTimeout",
    "Tool",
    "ToolContext",
    "ToolResult",
    "new_request_id",
    "pending",
    "pending_of",
]

PENDING_KEY = "pending"


class RunTimeout(TimeoutError):
    """The whole-run deadline (`timeout=`) passed before the run finished."""


class RunCancelled(Exception):
    """The run's cancel event was set."""


class ModelError(RuntimeError):
    """The model endpoint failed (after retries) or answered with something unusable."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after  # seconds the endpoint asked to wait (Retry-After)


class ResumeError(ValueError):
    """`run_with_answer` was given an answer or transcript it cannot resume from."""


# -- wire validation helpers ------------------------------------------------------------------


def _need_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _str_field(d: Mapping[str, Any], key: str, what: str, *, required: bool) -> str | None:
    if key not in d or d[key] is None:
        if required:
            raise ValueError(f"{what}.{key} is required")
        return None
    value = d[key]
    if not isinstance(value, str):
        raise ValueError(f"{what}.{key} must be a string, got {type(value).__name__}")
    return value


def _data_field(d: Mapping[str, Any], what: str) -> dict[str, Any] | None:
    value = d.get("data")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"{what}.data must be an object, got {type(value).__name__}")
    return dict(value)


def _parse_timestamp(value: str) -> datetime:
    """RFC 3339 timestamp -> aware datetime (a trailing Z is accepted)."""
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        raise ValueError("timestamp has no time zone")
    return parsed


_seq = itertools.count(1)
_pid_tag = f"{os.getpid():x}"


def new_request_id(prefix: str = "pnd") -> str:
    """A unique, opaque request id: `pnd-<ms hex>-<pid hex>-<seq>-<random>`.

    Ids are the correlation key hosts store and route answers by, so they must stay unique
    across processes and restarts, not only within one run.
    """
    return f"{prefix}-{int(time.time() * 1000):x}-{_pid_tag}{next(_seq):x}-{os.urandom(3).hex()}"


@dataclass(slots=True)
class Request:
    """A suspension: what the run needs from outside before it can go on."""

    id: str
    kind: str
    prompt: str = ""
    url: str | None = None
    data: dict[str, Any] | None = None
    expires_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "prompt": self.prompt}
        if self.url:
            out["url"] = self.url
        if self.data:
            out["data"] = self.data
        if self.expires_at:
            out["expiresAt"] = self.expires_at
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: Any) -> Request:
        d = _need_mapping(d, "Request")
        rid = _str_field(d, "id", "Request", required=True)
        if not rid:
            raise ValueError("Request.id must not be empty")
        kind = _str_field(d, "kind", "Request", required=True)
        if not kind:
            raise ValueError("Request.kind must not be empty")
        expires = _str_field(d, "expiresAt", "Request", required=False)
        if expires:
            try:
                _parse_timestamp(expires)
            except ValueError:
                raise ValueError(
                    f"Request.expiresAt must be an RFC 3339 timestamp, got {expires!r}"
                ) from None
        return cls(
            id=rid,
            kind=kind,
            prompt=_str_field(d, "prompt", "Request", required=False) or "",
            url=_str_field(d, "url", "Request", required=False) or None,
            data=_data_field(d, "Request"),
            expires_at=expires or None,
        )

    @property
    def expires_at_datetime(self) -> datetime | None:
        return _parse_timestamp(self.expires_at) if self.expires_at else None

    def is_expired(self, now: datetime | None = None) -> bool:
        when = self.expires_at_datetime
        return when is not None and when <= (now or datetime.now(UTC))


@dataclass(slots=True)
class Answer:
    """The host's reply to a `Request`: `ok` with optional `data`, or a refusal with a reason."""

    id: str
    ok: bool
    data: dict[str, Any] | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "ok": self.ok}
        if self.data:
            out["data"] = self.data
        if self.reason:
            out["reason"] = self.reason
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: Any) -> Answer:
        d = _need_mapping(d, "Answer")
        aid = _str_field(d, "id", "Answer", required=True)
        if not aid:
            raise ValueError("Answer.id must not be empty")
        if "ok" not in d:
            raise ValueError("Answer.ok is required")
        ok = d["ok"]
        if not isinstance(ok, bool):
            raise ValueError(f"Answer.ok must be a boolean, got {type(ok).__name__}")
        return cls(
            id=aid,
            ok=ok,
            data=_data_field(d, "Answer"),
            reason=_str_field(d, "reason", "Answer", required=False) or "",
        )


@dataclass(slots=True)
class ToolResult:
    output: str
    is_error: bool = False
    metadata: dict[str, Any] | None = None


@dataclass(slots=True)
class ToolContext:
    """What a tool execution knows besides its arguments.

    The loop fills `call_id` (the provider's tool-call id) and `arguments` (the provider's raw
    argument string) on every execution; `answer` is set only when a suspended call is run
    again with the host's answer.
    """

    answer: Answer | None = None
    call_id: str | None = None
    arguments: str | None = None
    cancel: Any = None  # asyncio.Event | None
    turn: int | None = None
    # Where the calling assistant turn sits in the transcript: with `call_id`, a key that
    # stays the same when a stored run is resumed or continued in another process.
    message_index: int | None = None


ExecuteFn = Callable[[dict[str, Any], ToolContext], "ToolResult | Awaitable[ToolResult]"]


@dataclass(slots=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    source: str = "native"
    execute: ExecuteFn | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("Tool.name must be a non-empty string")
        if self.input_schema is None:
            self.input_schema = {"type": "object", "properties": {}}


@dataclass(slots=True)
class RunResult:
    status: str  # "done" | "pending" | "incomplete"
    text: str
    messages: list[dict[str, Any]]
    pending: Request | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    model: str = ""
    limit: str | None = None

    @property
    def tool_call_count(self) -> int:
        return len(self.tool_calls)


def pending(
    *,
    kind: str,
    prompt: str,
    id: str | None = None,
    url: str | None = None,
    data: dict[str, Any] | None = None,
    expires_at: str | None = None,
) -> ToolResult:
    """A suspension result: the loop halts (or asks `wait_for`) instead of treating it as output."""
    request = Request(
        id=id or new_request_id(),
        kind=kind,
        prompt=prompt,
        url=url,
        data=data,
        expires_at=expires_at,
    )
    output = f"{prompt}\n{url}" if url else prompt
    return ToolResult(output=output, is_error=True, metadata={PENDING_KEY: request})


def pending_of(result: ToolResult | None) -> Request | None:
    if result is None or not result.metadata:
        return None
    value = result.metadata.get(PENDING_KEY)
    return value if isinstance(value, Request) else None
