"""The MCP elicitation bridge: an MCP server's `elicitation/create` as a toolnexus Request,
and a toolnexus Answer as the MCP `ElicitResult` (accept / decline / cancel)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .types import Answer, Request, new_request_id

__all__ = ["answer_to_elicit_result", "elicitation_to_request"]


def _field(params: Any, *names: str) -> Any:
    for name in names:
        if isinstance(params, Mapping):
            if name in params:
                return params[name]
        elif hasattr(params, name):
            return getattr(params, name)
    return None


def elicitation_to_request(params: Any) -> Request:
    """Form mode -> `kind:"input"` with `data.schema`; url mode -> `kind:"authorization"`."""
    message = _field(params, "message")
    prompt = message if isinstance(message, str) else ""
    if _field(params, "mode") == "url":
        url = _field(params, "url")
        return Request(
            id=new_request_id("elc"),
            kind="authorization",
            prompt=prompt,
            url=url if isinstance(url, str) else None,
        )
    schema = _field(params, "requestedSchema", "requested_schema")
    if schema is not None and hasattr(schema, "model_dump"):  # the MCP SDK's pydantic models
        schema = schema.model_dump(by_alias=True, exclude_none=True)
    data = {"schema": dict(schema)} if isinstance(schema, Mapping) else None
    return Request(id=new_request_id("elc"), kind="input", prompt=prompt, data=data)


def answer_to_elicit_result(answer: Answer) -> dict[str, Any]:
    """`ok` -> accept with the answer's data; reason "declined" -> decline; else cancel."""
    if answer.ok:
        return {"action": "accept", "content": dict(answer.data or {})}
    if answer.reason == "declined":
        return {"action": "decline"}
    return {"action": "cancel"}
