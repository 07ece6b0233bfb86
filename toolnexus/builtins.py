"""Built-in tools. Only `question` is implemented; the full name list feeds the relay guard."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .texts import question_not_answered, question_prompt
from .types import Tool, ToolContext, ToolResult, pending

__all__ = [
    "BUILTIN_NAMES",
    "QUESTION_KIND",
    "builtins_enabled",
    "create_builtin_tools",
    "question_prompt",
    "select_builtins",
]

# Every builtin name of the toolnexus ports, in their fixed order. The relay collision guard
# checks against all of them, whichever are implemented or enabled here.
BUILTIN_NAMES: tuple[str, ...] = (
    "bash",
    "read",
    "write",
    "edit",
    "grep",
    "glob",
    "webfetch",
    "question",
    "apply_patch",
    "todowrite",
)

QUESTION_KIND = "question"

QUESTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "questions": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "question": {"type": "string", "description": "The question to ask"},
                    "header": {"type": "string", "description": "A short label"},
                    "options": {
                        "type": "array",
                        "items": {
                            "anyOf": [
                                {"type": "string"},
                                {
                                    "type": "object",
                                    "properties": {
                                        "label": {"type": "string"},
                                        "description": {"type": "string"},
                                    },
                                    "required": ["label"],
                                },
                            ]
                        },
                    },
                    "custom": {
                        "type": "boolean",
                        "description": "Allow typing your own answer besides the options"
                        " (default: true)",
                    },
                },
                "required": ["question"],
            },
        }
    },
    "required": ["questions"],
}


def _question(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    answer = ctx.answer if ctx else None
    if answer is None:
        questions = (args or {}).get("questions")
        return pending(
            kind=QUESTION_KIND,
            prompt=question_prompt(questions),
            data={"questions": questions if questions is not None else []},
        )
    if not answer.ok:
        return ToolResult(question_not_answered(answer.reason), is_error=True)
    return ToolResult(json.dumps(answer.data or {}, separators=(",", ":"), ensure_ascii=False))


def create_builtin_tools() -> list[Tool]:
    return [
        Tool(
            name="question",
            description="Ask the user one or more questions and wait for the answers.",
            input_schema=QUESTION_SCHEMA,
            source="builtin",
            execute=_question,
        )
    ]


def builtins_enabled(config: Any) -> bool:
    if config is None or config is True:
        return True
    if config is False:
        return False
    if isinstance(config, Mapping):
        if config.get("disabled") is True:
            return False
        return config.get("enabled") is not False
    raise TypeError(f"builtins must be True, False or a mapping, got {type(config).__name__}")


def select_builtins(config: Any) -> list[Tool]:
    if not builtins_enabled(config):
        return []
    tools = create_builtin_tools()
    toggles = config.get("tools") if isinstance(config, Mapping) else None
    if isinstance(toggles, Mapping):
        tools = [t for t in tools if toggles.get(t.name, True) is not False]
    return tools
