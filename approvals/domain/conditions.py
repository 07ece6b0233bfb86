"""Rule conditions: CEL expressions (cel-python) over a call's `args` and its `run`.

Pure functions, no database: `compile_condition` refuses an expression that does not parse
(ConditionInvalid, with the line and column of the error); `evaluate` answers True only for
a CEL `true`, and reports an evaluation error (a missing key, a wrong type) as
ConditionFailed, never as a match.
"""

from __future__ import annotations

import functools
from typing import Any

import celpy
from celpy.celparser import CELParseError

MAX_CONDITION_CHARS = 2000


class ConditionInvalid(ValueError):
    """The expression does not compile; `line` and `column` point at the error (1-based)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        where = f" (line {line}, column {column})" if line and column else ""
        super().__init__(f"{message}{where}")
        self.line, self.column = line, column


class ConditionFailed(Exception):
    """The expression raised or produced an error for this call: the rule does not match."""


_ENV = celpy.Environment()


@functools.lru_cache(maxsize=512)
def compile_condition(text: str) -> Any:
    """The runnable program for `text`, or ConditionInvalid (cached per text)."""
    if len(text) > MAX_CONDITION_CHARS:
        raise ConditionInvalid(f"a condition is at most {MAX_CONDITION_CHARS} characters")
    try:
        return _ENV.program(_ENV.compile(text))
    except CELParseError as exc:
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        raise ConditionInvalid(
            f"the condition does not compile near {_near(text, line, column)!r}",
            line,
            column,
        ) from None
    except Exception as exc:  # the parser's other refusals (lark errors, recursion)
        raise ConditionInvalid(f"the condition does not compile: {exc}") from None


def evaluate(text: str, *, args: Any, run: dict[str, Any]) -> bool:
    """Whether the condition holds for a call; ConditionFailed when it cannot be evaluated
    (an invalid stored condition included). Only a boolean true is a match."""
    try:
        program = compile_condition(text)
        activation = {"args": celpy.json_to_cel(args), "run": celpy.json_to_cel(run)}
        value = program.evaluate(activation)
    except ConditionInvalid as exc:
        raise ConditionFailed(str(exc)) from None
    except RecursionError:
        raise ConditionFailed("the condition nests too deep for these arguments") from None
    except Exception as exc:  # CEL raises its own errors and any of Python's
        raise ConditionFailed(_message(exc)) from None
    if isinstance(value, celpy.CELEvalError):
        raise ConditionFailed(_message(value))
    return isinstance(value, celpy.celtypes.BoolType) and bool(value)


def _near(text: str, line: int | None, column: int | None) -> str:
    """The source from the error's position (cel-python's message is the source and a caret)."""
    lines = text.splitlines() or [""]
    if not line or not column or line > len(lines):
        return text[:40]
    rest = lines[line - 1][column - 1 :]
    return rest[:40] or "the end of the condition"


def _message(exc: BaseException) -> str:
    first = exc.args[0] if exc.args else exc
    return str(first)[:300]


def equals_condition(args: Any) -> str:
    """A condition that holds for exactly these arguments: `args == {...}`, the arguments
    written as a CEL literal (strings escaped here, never pasted in), so a value cannot end
    the literal and add an expression of its own. ValueError for a value CEL cannot state
    (a number that is not finite, a key that is not a string)."""
    return f"args == {_cel_literal(args if args is not None else {})}"


def _cel_literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("a number that is not finite")
        text = repr(value)
        return text if any(c in text for c in ".e") else f"{text}.0"
    if isinstance(value, str):
        return _cel_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_cel_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("a key that is not a string")
        items = (f"{_cel_string(k)}: {_cel_literal(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise ValueError(f"a value of type {type(value).__name__}")


_CEL_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _cel_string(text: str) -> str:
    out = []
    for char in text:
        if char in _CEL_ESCAPES:
            out.append(_CEL_ESCAPES[char])
        elif " " <= char <= "~":
            out.append(char)
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'
