"""The approval gate: a tool that runs only after a human said yes to exactly these arguments."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from .schema import schema_errors
from .texts import approval_prompt, edited_arguments_invalid, not_approved
from .types import Tool, ToolContext, ToolResult, pending

__all__ = ["APPROVAL_KIND", "approval_required"]

APPROVAL_KIND = "approval"

PromptArg = str | Callable[[str, dict[str, Any]], str] | None


def approval_required(tool: Tool, *, prompt: PromptArg = None) -> Tool:
    """Wrap `tool` so its first call suspends with `kind:"approval"`.

    `data` carries what the reviewer sees: `tool`, `input` (parsed) and `arguments` (raw, as
    the provider sent them). On an `ok` answer the tool runs with `answer.data["input"]` when
    the reviewer edited the arguments, after validating them against the tool's schema.
    """
    if tool.execute is None:
        raise ValueError(f"tool {tool.name!r} has no execute function to gate")
    inner = tool.execute

    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        answer = ctx.answer if ctx else None
        if answer is None:
            text = (
                prompt(tool.name, args)
                if callable(prompt)
                else (prompt or approval_prompt(tool.name, args))
            )
            raw = ctx.arguments if ctx and ctx.arguments is not None else json.dumps(args)
            return pending(
                kind=APPROVAL_KIND,
                prompt=text,
                data={"tool": tool.name, "input": dict(args or {}), "arguments": raw},
            )
        if not answer.ok:
            return ToolResult(not_approved(tool.name, answer.reason), is_error=True)
        run_args = args
        edited = (answer.data or {}).get("input")
        if edited is not None:
            if not isinstance(edited, Mapping):
                return ToolResult(
                    edited_arguments_invalid(tool.name, "input must be an object"), is_error=True
                )
            problems = schema_errors(dict(edited), tool.input_schema)
            if problems:
                return ToolResult(
                    edited_arguments_invalid(tool.name, "; ".join(problems)), is_error=True
                )
            run_args = dict(edited)
        # The gated tool sees a fresh context: the approval answer was meant for the gate.
        inner_ctx = ToolContext(
            call_id=ctx.call_id if ctx else None,
            arguments=json.dumps(run_args)
            if edited is not None
            else (ctx.arguments if ctx else None),
            cancel=ctx.cancel if ctx else None,
            turn=ctx.turn if ctx else None,
        )
        result = inner(run_args, inner_ctx)
        if inspect.isawaitable(result):
            result = await result
        return result

    return Tool(
        name=tool.name,
        description=tool.description,
        input_schema=tool.input_schema,
        source=tool.source,
        execute=execute,
    )
