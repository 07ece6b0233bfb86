"""Rule conditions: CEL expressions (cel-python) over a call's `args` and its `run`.

Pure functions, no database: `compile_condition` refuses an expression that does not parse
(ConditionInvalid, with the line and column of the error); `evaluate` answers True only for
a CEL `true`, and reports an evaluation error (a missing key, a wrong type) as
ConditionFailed, never as a match.

Evaluation time is bounded. cel-python interprets the parsed tree in Python (a macro's body
costs some 100 microseconds an element), so a condition over a large list from the
arguments, macros nested in macros' bodies or a value doubled by `+` inside a macro could
take seconds, or memory without end. Limits, cheapest first:

- when saved (ConditionInvalid, at the position): at most MAX_CONDITION_CHARS characters, a
  parse tree at most MAX_DEPTH levels deep (each bracket, call or chained operator adds
  levels; deeper would exhaust Python's recursion while evaluating), and macros (all,
  exists, exists_one, map, filter, reduce) nested at most MAX_MACRO_NESTING deep in one
  another's bodies;
- on each call (ConditionOverBudget, a ConditionFailed: no match, logged): the arguments and
  the run at most MAX_ARGUMENT_VALUES values, MAX_ARGUMENT_CHARS characters of text and
  MAX_ARGUMENT_DEPTH levels; `+` may build at most MAX_BUILT characters, bytes or list
  elements in all (doubling a string in a macro would otherwise take memory without end);
  and the whole evaluation, the arguments' conversion included, is stopped at the first
  step after EVALUATION_SECONDS (every node of the tree is a step, in every element a
  macro visits);
- `duration()` checks its text before cel-python's own pattern, which backtracks
  exponentially on text such as "aaaaaaaaaaaaaaaaaaaaaaaa!" (seconds in one step).
"""

from __future__ import annotations

import functools
import operator
import re
import time
from typing import Any

import celpy
import lark
from celpy.celparser import CELParseError
from celpy.celtypes import DurationType
from celpy.evaluation import Activation, Evaluator

MAX_CONDITION_CHARS = 2000
MAX_DEPTH = 200
MAX_MACRO_NESTING = 2
MAX_ARGUMENT_VALUES = 5000
MAX_ARGUMENT_CHARS = 1_000_000
MAX_ARGUMENT_DEPTH = 64
MAX_BUILT = 200_000
EVALUATION_SECONDS = 0.1

MACROS = frozenset({"all", "exists", "exists_one", "map", "filter", "reduce"})


class ConditionInvalid(ValueError):
    """The expression does not compile; `line` and `column` point at the error (1-based)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        where = f" (line {line}, column {column})" if line and column else ""
        super().__init__(f"{message}{where}")
        self.line, self.column = line, column


class ConditionFailed(Exception):
    """The expression raised or produced an error for this call: the rule does not match."""


class ConditionOverBudget(ConditionFailed):
    """The call's arguments or the evaluation went over a bound: the rule does not match."""


class _OverBudget(BaseException):
    """Raised inside cel-python's evaluation to stop it at once. A BaseException: no
    `except Exception` on the way handles it (cel-python logs those as errors), and it is
    never one of the errors CEL turns into a value (which `|| true` would then ignore)."""


class _Budget:
    """One evaluation's bounds: its deadline, and what its `+` may still build."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + EVALUATION_SECONDS
        self.built = 0

    def spend_step(self) -> None:
        if time.monotonic() > self.deadline:
            raise _OverBudget(f"it took longer than {EVALUATION_SECONDS * 1000:.0f} ms")

    def add(self, left: Any, right: Any) -> Any:
        """CEL's `+`, counting the strings, bytes and lists it builds against MAX_BUILT."""
        sized = (str, bytes, list)  # cel-python's types, and what their `+` gives (a str)
        if isinstance(left, sized) and isinstance(right, sized):
            self.built += len(left) + len(right)
            if self.built > MAX_BUILT:
                raise _OverBudget(f"its + built more than {MAX_BUILT} characters or items")
        return operator.add(left, right)


class _BoundedEvaluator(Evaluator):
    """cel-python's tree interpreter, checking the budget before every step."""

    def __init__(self, ast: lark.Tree, activation: Any, budget: _Budget):
        super().__init__(ast, activation)
        self.budget = budget

    def sub_evaluator(self, ast: lark.Tree) -> Evaluator:  # a macro's body, per element
        return _BoundedEvaluator(ast, self.activation, self.budget)

    def _visit_tree(self, tree: lark.Tree) -> Any:  # every node, from visit and visit_children
        self.budget.spend_step()
        return super()._visit_tree(tree)


class _BoundedRunner(celpy.InterpretedRunner):
    def evaluate_within(self, context: dict[str, Any], budget: _Budget) -> Any:
        functions = {"_+_": budget.add, "duration": _duration}  # macros' scopes copy them
        activation = Activation(
            package=self.environment.package,
            annotations=self.environment.annotations,
            functions=functions,
        )
        return _BoundedEvaluator(self.ast, activation, budget).evaluate(context)


# A duration's text as CEL writes it ("1h30m", "-1.5s", ".5ms"): unambiguous, so matching it
# never backtracks far; anything else is refused before cel-python's own pattern sees it.
_DURATION = re.compile(r"[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|ms|s|m|h|d))+")


def _duration(value: Any) -> Any:
    if isinstance(value, str) and not _DURATION.fullmatch(value):
        raise ValueError(f"invalid duration {value[:40]!r}")
    return DurationType(value)


_ENV = celpy.Environment(runner_class=_BoundedRunner)


@functools.lru_cache(maxsize=512)
def compile_condition(text: str) -> Any:
    """The runnable program for `text`, or ConditionInvalid (cached per text)."""
    if len(text) > MAX_CONDITION_CHARS:
        line, column = _position(text, MAX_CONDITION_CHARS)
        raise ConditionInvalid(
            f"a condition is at most {MAX_CONDITION_CHARS} characters", line, column
        )
    try:
        ast = _ENV.compile(text)
    except CELParseError as exc:
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        raise ConditionInvalid(
            f"the condition does not compile near {_near(text, line, column)!r}",
            line,
            column,
        ) from None
    except Exception as exc:  # the parser's other refusals (lark errors, recursion)
        raise ConditionInvalid(f"the condition does not compile: {exc}") from None
    _check_shape(text, ast)
    try:
        return _ENV.program(ast)
    except Exception as exc:
        raise ConditionInvalid(f"the condition does not compile: {exc}") from None


def _check_shape(text: str, ast: lark.Tree) -> None:
    """ConditionInvalid, at the position, for a tree deeper than MAX_DEPTH or macros nested
    deeper than MAX_MACRO_NESTING (walked without recursion: the tree may be deep)."""
    stack: list[tuple[lark.Tree, int, int]] = [(ast, 1, 0)]
    while stack:
        node, depth, macros = stack.pop()
        if depth > MAX_DEPTH:
            line, column = _meta(node)
            raise ConditionInvalid(
                f"the condition nests too deeply near {_near(text, line, column)!r}: its"
                f" parse tree is at most {MAX_DEPTH} levels deep (each bracket, call or"
                " chained operator adds levels)",
                line,
                column,
            )
        children = [c for c in node.children if isinstance(c, lark.Tree)]
        name = node.children[1] if node.data == "member_dot_arg" else None
        if isinstance(name, lark.Token) and name.value in MACROS and len(node.children) > 2:
            if macros + 1 > MAX_MACRO_NESTING:
                line, column = name.line, name.column
                raise ConditionInvalid(
                    f"the condition nests macros too deeply at {name.value!r}: a macro"
                    f" (all, exists, exists_one, map, filter, reduce) may sit in another's"
                    f" body, at most {MAX_MACRO_NESTING} deep",
                    line,
                    column,
                )
            target, body = node.children[0], node.children[2]
            stack.append((target, depth + 1, macros))  # its list: not inside the macro
            stack.append((body, depth + 1, macros + 1))
            continue
        stack.extend((child, depth + 1, macros) for child in children)


def _meta(node: lark.Tree) -> tuple[int | None, int | None]:
    meta = getattr(node, "_meta", None)  # lark sets it with propagate_positions
    if meta is None or getattr(meta, "empty", True):
        return None, None
    return getattr(meta, "line", None), getattr(meta, "column", None)


def _position(text: str, index: int) -> tuple[int, int]:
    """The 1-based line and column of `text[index]`."""
    before = text[:index]
    return before.count("\n") + 1, index - (before.rfind("\n") + 1) + 1


def evaluate(text: str, *, args: Any, run: dict[str, Any]) -> bool:
    """Whether the condition holds for a call; ConditionFailed when it cannot be evaluated
    (an invalid stored condition included), ConditionOverBudget (a ConditionFailed) when
    the arguments or the evaluation go over a bound. Only a boolean true is a match."""
    budget = _Budget()
    try:
        program = compile_condition(text)
        _check_size(args, run)
        activation = {"args": celpy.json_to_cel(args), "run": celpy.json_to_cel(run)}
        value = program.evaluate_within(activation, budget)
    except ConditionInvalid as exc:
        raise ConditionFailed(str(exc)) from None
    except _OverBudget as exc:
        raise ConditionOverBudget(f"the condition was stopped: {exc}") from None
    except RecursionError:
        raise ConditionFailed("the condition nests too deep for these arguments") from None
    except Exception as exc:  # CEL raises its own errors and any of Python's
        raise ConditionFailed(_message(exc)) from None
    if isinstance(value, celpy.CELEvalError):
        raise ConditionFailed(_message(value))
    return isinstance(value, celpy.celtypes.BoolType) and bool(value)


def _check_size(*documents: Any) -> None:
    """_OverBudget for arguments over MAX_ARGUMENT_VALUES values, MAX_ARGUMENT_CHARS
    characters or MAX_ARGUMENT_DEPTH levels (counted without recursion, before any is
    converted for CEL: a conversion costs some microseconds a value)."""
    values = chars = 0
    stack = [(document, 1) for document in documents]
    while stack:
        value, depth = stack.pop()
        values += 1
        if depth > MAX_ARGUMENT_DEPTH:
            raise _OverBudget(f"the arguments nest more than {MAX_ARGUMENT_DEPTH} levels deep")
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict):
            chars += sum(len(k) for k in value if isinstance(k, str))
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list | tuple):
            stack.extend((v, depth + 1) for v in value)
        if values > MAX_ARGUMENT_VALUES:
            raise _OverBudget(f"the arguments hold more than {MAX_ARGUMENT_VALUES} values")
    if chars > MAX_ARGUMENT_CHARS:
        raise _OverBudget(f"the arguments hold more than {MAX_ARGUMENT_CHARS} characters")


def _near(text: str, line: int | None, column: int | None) -> str:
    """The source from the error's position (cel-python's message is the source and a caret)."""
    lines = text.splitlines() or [""]
    if not line or not column or line > len(lines):
        return text[:40]
    rest = lines[line - 1][column - 1 :]
    return rest[:40] or "the end of the condition"


def _message(exc: BaseException) -> str:
    first = exc.args[0] if exc.args else exc
    try:
        return str(first)[:300]
    except Exception:  # a value whose text cannot be made (an int of too many digits)
        return type(exc).__name__


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
