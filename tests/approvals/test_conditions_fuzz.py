"""An expression fuzz (hypothesis) of rule conditions: whatever the text and whatever the
call's arguments, compiling either refuses with ConditionInvalid (the error saving a rule
shows at the field) or gives a program, and evaluating answers match (True), no match
(False) or ConditionFailed (no match, logged by the caller); no other exception leaves
`approvals.domain.conditions`, and `first_match` never raises for any of them.

Two kinds of text: random strings (mostly refused by the parser), and well-formed
expressions from a small CEL grammar (comparisons, &&, ||, !, ?:, arithmetic, field access
and indexing on `args` and `run`, `in`, has(), size(), conversions, string methods and the
list macros), evaluated against random argument dicts (nested, wrong types, missing keys,
huge ints, unicode, NaN)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from approvals.domain.conditions import (
    ConditionFailed,
    ConditionInvalid,
    compile_condition,
    evaluate,
)
from approvals.domain.rules import CallFacts, first_match

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # the same examples on every run: a failure here is reproducible
)

# -- arguments -------------------------------------------------------------------------------

KEYS = ["amount", "currency", "order", "tags", "items", "n", "user", "role", "x", "é", ""]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # beyond int64 too: CEL's ints are 64-bit
    st.sampled_from([2**63 - 1, -(2**63), 2**63, 2**64, -(2**64), 10**30, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["USD", "eur", "", "😀", "\x00", "a\nb", "1s", "2020-01-01T00:00:00Z"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=5)), inner, max_size=5),
    ),
    max_leaves=25,
)
# Mostly a dict (what a tool's input is), sometimes anything at all.
arguments = st.one_of(
    st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6),
    json_values,
)
runs = st.fixed_dictionaries(
    {
        "id": st.one_of(st.integers(min_value=1, max_value=10**6), st.none()),
        "agent": st.sampled_from(["demo", "", "ops", "é"]),
        "prompt": st.text(max_size=30),
        "started_by": st.one_of(st.none(), st.sampled_from(["reviewer", "ann", ""])),
    }
)

# -- well-formed expressions -----------------------------------------------------------------


def _string_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


literals = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["0", "1", "50", "-1", "9223372036854775807", "0x7f", "3u", "0u"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr).filter(lambda s: "e" not in s),
    st.sampled_from(["1.5", "0.0", "-2.25", "1e3", "1e308", "1e400"]),
    st.text(max_size=8).map(_string_literal),
    st.sampled_from(['"USD"', '"refund"', "'single'", '""', 'b"bytes"', "r'raw\\d'"]),
    st.sampled_from(["true", "false", "null"]),
)
fields = st.sampled_from([*KEYS[:-2], "missing", "prompt", "started_by", "agent", "id"])
paths = st.builds(
    lambda root, names: root + "".join(f".{n}" for n in names),
    st.sampled_from(["args", "run"]),
    st.lists(fields, max_size=3),
)
MACROS = ["all", "exists", "exists_one", "map", "filter"]


def expressions(depth: int = 3) -> st.SearchStrategy[str]:
    base = st.one_of(literals, paths, st.sampled_from(["x", "y", "args", "run"]))
    if depth == 0:
        return base
    sub = st.deferred(lambda: expressions(depth - 1))
    return st.one_of(
        base,
        st.builds(
            lambda a, op, b: f"{a} {op} {b}",
            sub,
            st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "in", "&&", "||"]),
            sub,
        ),
        st.builds(
            lambda a, op, b: f"({a} {op} {b})", sub, st.sampled_from(["+", "-", "*", "/", "%"]), sub
        ),
        st.builds(lambda op, a: f"{op}{a}", st.sampled_from(["!", "-", "!!", "--"]), sub),
        st.builds(lambda c, a, b: f"({c} ? {a} : {b})", sub, sub, sub),
        st.builds(lambda a: f"({a})", sub),
        st.builds(lambda items: "[" + ", ".join(items) + "]", st.lists(sub, max_size=4)),
        st.builds(
            lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}",
            st.lists(st.tuples(sub, sub), max_size=3),
        ),
        st.builds(lambda a, i: f"{a}[{i}]", sub, sub),
        st.builds(lambda p: f"has({p})", paths.filter(lambda p: "." in p)),
        st.builds(
            lambda f, a: f"{f}({a})",
            st.sampled_from(
                [
                    *("size", "int", "uint", "double", "string", "bytes", "bool", "type"),
                    *("dyn", "duration", "timestamp"),
                ]
            ),
            sub,
        ),
        st.builds(
            lambda a, m, b: f"{a}.{m}({b})",
            sub,
            st.sampled_from(["startsWith", "endsWith", "contains", "matches", "size"]),
            sub,
        ),
        st.builds(
            lambda target, macro, var, body: f"{target}.{macro}({var}, {body})",
            st.one_of(sub, paths),
            st.sampled_from(MACROS),
            st.sampled_from(["x", "y"]),
            sub,
        ),
        st.builds(lambda target: f"{target}.reduce(r, x, 0, r + x)", st.one_of(sub, paths)),
    )


# Whole conditions: usually a comparison or a boolean combination, as rules are written.
conditions = st.one_of(
    expressions(),
    st.builds(lambda a, b: f"{a} && {b}", expressions(2), expressions(2)),
    st.builds(lambda a, b: f"{a} <= {b}", paths, literals),
)

# -- the property ----------------------------------------------------------------------------


def check(text: str, args, run) -> None:
    try:
        compile_condition(text)
    except ConditionInvalid as exc:
        assert str(exc)
        # A refusal from the parser names where: line and column, 1-based, within the text.
        if exc.line is not None:
            assert exc.line >= 1 and exc.column is not None and exc.column >= 1
    try:
        holds = evaluate(text, args=args, run=run)
    except ConditionFailed as exc:
        assert isinstance(str(exc), str)
    else:
        assert holds is True or holds is False
    rule = SimpleNamespace(
        pk=1,
        position=0,
        effect="approve",
        enabled=True,
        expires_at=None,
        agent="",
        kind="",
        run_id=None,
        tool="",
        condition=text,
    )
    facts = CallFacts(agent="demo", tool="refund", kind="tool_call", args=args, run=run)
    match = first_match([rule], facts, datetime.now(UTC))
    assert match.rule is rule or match.rule is None


@FUZZ
@given(text=st.text(max_size=60), args=arguments, run=runs)
def test_random_text_never_raises_out_of_compile_or_evaluation(text, args, run):
    check(text, args, run)


@FUZZ
@given(
    text=st.text(alphabet="args.run()[]{}!&|=<>+-*/%?:,\"' 0123456789xyin_has", max_size=60),
    args=arguments,
    run=runs,
)
def test_text_of_cel_characters_never_raises(text, args, run):
    check(text, args, run)


@FUZZ
@given(text=conditions, args=arguments, run=runs)
def test_well_formed_conditions_never_raise_out_of_evaluation(text, args, run):
    check(text, args, run)


@FUZZ
@given(text=conditions)
def test_a_condition_compiles_or_is_refused_and_then_evaluates_the_same_way_twice(text):
    args = {"amount": 20, "currency": "USD", "tags": ["a"], "items": [{"n": 1}]}
    run = {"id": 1, "agent": "demo", "prompt": "p", "started_by": None}
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(evaluate(text, args=args, run=run))
        except ConditionFailed as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1] or all(isinstance(o, str) for o in outcomes)


def test_nan_and_huge_numbers_in_arguments_do_not_match_by_accident():
    assert evaluate("args.amount <= 50", args={"amount": math.nan}, run={}) is False
    for huge in (2**64, -(2**64), 10**30):
        try:
            holds = evaluate("args.amount <= 50", args={"amount": huge}, run={})
        except ConditionFailed:
            continue
        assert holds is (huge <= 50)
