"""Building clients: `create_client` (a model endpoint) and `create_in_process_client`.

A `Client` (the run loop, `loop.py`) drives a model backend: `model_http.HTTPModel` for an
OpenAI- or Anthropic-style endpoint, `in_process.InProcessModel` for a Python function. The
names below stay importable from here as they always were.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .dialects import ANTHROPIC, OPENAI
from .in_process import InProcessModel, InProcessRequest, InProcessResponse, InProcessToolCall
from .loop import Client, declined_text
from .model_http import HTTPModel

__all__ = [
    "Client",
    "InProcessRequest",
    "InProcessResponse",
    "InProcessToolCall",
    "create_client",
    "create_in_process_client",
    "declined_text",
]

# Options that configure the model backend; the rest configure the loop (`Client`).
_HTTP_OPTIONS = ("retries", "retry_base_ms", "request_timeout", "http_client", "limits")
_IN_PROCESS_OPTIONS = ("retries", "retry_base_ms", "word_delay")


def _api_key(style: str, explicit: str | None) -> str | None:
    if explicit:
        return explicit
    preferred = "ANTHROPIC_API_KEY" if style == "anthropic" else "OPENAI_API_KEY"
    return os.environ.get(preferred) or None


def _split(options: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: options.pop(name) for name in names if name in options}


def create_client(
    *,
    base_url: str,
    style: str = "openai",
    model: str,
    api_key: str | None = None,
    headers: dict[str, str] | None = None,
    **options: Any,
) -> Client:
    """A client for an OpenAI-compatible (`style="openai"`) or Anthropic endpoint.

    Options: `system_prompt`, `max_turns`, `wait_for`, `hooks`, `timeout` (whole run) and
    `budget_check(turns, usage, tool_calls)` (asked before each model call; a limit name it
    returns ends the run `incomplete` with that `limit`) and `on_text(delta)` (the reply's
    text as the model generates it: the body asks for a stream) for the loop; `retries`, `retry_base_ms`, `request_timeout` (one model call), `http_client` (an
    `httpx.AsyncClient` to use as it is) and `limits` (`httpx.Limits` of the engine's own
    client) for the endpoint.
    """
    base = base_url.rstrip("/")
    key = _api_key(style, api_key)
    extra = dict(headers or {})
    if style == "openai":
        dialect, url = OPENAI, f"{base}/chat/completions"
        if key:
            extra.setdefault("authorization", f"Bearer {key}")
    elif style == "anthropic":
        dialect = ANTHROPIC
        url = f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages"
        extra.setdefault("anthropic-version", "2023-06-01")
        if key:
            extra.setdefault("x-api-key", key)
    else:
        raise ValueError(f"style must be 'openai' or 'anthropic', got {style!r}")
    backend = HTTPModel(dialect=dialect, url=url, headers=extra, **_split(options, _HTTP_OPTIONS))
    return Client(backend=backend, model=model, **options)


def create_in_process_client(
    *, generate: Callable[[InProcessRequest], Any], model: str = "in-process", **options: Any
) -> Client:
    """A client whose model is a Python function: no URL, no socket. Transcripts are
    OpenAI-shaped. Failures of `generate` are not retried unless `retries` is given;
    `word_delay` (seconds) streams a turn's text word by word (`on_text`, `stream`)."""
    if not callable(generate):
        raise TypeError("create_in_process_client needs a callable generate")
    for wire_only in ("base_url", "api_key", "style", "http_client", "headers"):
        if wire_only in options:
            raise TypeError(f"create_in_process_client does not take {wire_only!r}")
    options.pop("request_timeout", None)  # accepted as before; there is no request to time
    backend = InProcessModel(generate, model=model, **_split(options, _IN_PROCESS_OPTIONS))
    return Client(backend=backend, model=model, **options)
