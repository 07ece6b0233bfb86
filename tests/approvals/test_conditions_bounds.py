"""Evaluation time is bounded: a condition too deep or with macros nested too deep is refused
when saved (at the position), and on a call, arguments over the bounds, a `+` building too
much or an evaluation past EVALUATION_SECONDS stop with ConditionOverBudget: no match,
logged, and the run halts for a person as with any condition that fails."""

from __future__ import annotations

import logging
import time

import pytest

from approvals import testing
from approvals.domain import conditions
from approvals.domain.conditions import (
    EVALUATION_SECONDS,
    MAX_ARGUMENT_CHARS,
    MAX_ARGUMENT_DEPTH,
    MAX_ARGUMENT_VALUES,
    MAX_DEPTH,
    MAX_MACRO_NESTING,
    ConditionFailed,
    ConditionInvalid,
    ConditionOverBudget,
    compile_condition,
    evaluate,
)
from approvals.models import ApprovalRequest, Rule

from .factories import post_json, session_client
from .test_rules_api import SMALL_REFUNDS, rule_manager

# Over a list of 4000 numbers from the arguments, a macro in a macro's body is 16 million
# evaluations of its body: some 30 minutes in cel-python (about 100 us each).
QUADRATIC = "args.xs.all(x, args.xs.all(y, x + y >= 0))"
XS = {"xs": list(range(4000))}
# Stops the clock's margin: the budget plus one step, on a slow machine.
SLACK = 0.4


def elapsed(text: str, args) -> tuple[float, Exception | bool]:
    started = time.monotonic()
    try:
        outcome: Exception | bool = evaluate(text, args=args, run={})
    except ConditionFailed as exc:
        outcome = exc
    return time.monotonic() - started, outcome


# -- refused when saved ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "(" * 40 + "1" + ")" * 40 + " == 1",
        "[" * 40 + "1" + "]" * 40 + " != []",
        "!" * 300 + "true",
        " + ".join(["1"] * 200) + " > 0",
    ],
)
def test_a_condition_nested_too_deeply_is_refused_with_where(text):
    with pytest.raises(ConditionInvalid) as refused:
        compile_condition(text)
    assert "nests too deeply" in str(refused.value)
    assert refused.value.line == 1 and refused.value.column >= 1


def test_macros_nested_deeper_than_the_limit_are_refused_at_the_innermost():
    assert MAX_MACRO_NESTING == 2
    compile_condition("args.items.all(i, i.tags.exists(t, t == 'x'))")  # two: fine
    # Macros one after another, or in another's list, are not nested.
    compile_condition("args.a.all(x, x > 0) && args.b.map(y, y).filter(z, z > 1).size() > 0")
    text = "args.a.all(x, args.b.exists(y, args.c.map(z, z + y).size() > x))"
    with pytest.raises(ConditionInvalid) as refused:
        compile_condition(text)
    assert "nests macros too deeply at 'map'" in str(refused.value)
    assert (refused.value.line, refused.value.column) == (1, text.index("map") + 1)


def test_a_condition_too_long_is_refused_at_the_first_character_over():
    with pytest.raises(ConditionInvalid) as refused:
        compile_condition("true || " * 300 + "true")
    assert (refused.value.line, refused.value.column) == (1, 2001)


def test_the_deepest_conditions_allowed_still_evaluate_deep_in_a_callers_stack():
    """MAX_DEPTH leaves room for the caller: each kind of nesting, at the deepest allowed,
    evaluates with 300 frames already on the stack (the worker's are far fewer)."""

    def deepest(make):
        n = 1
        while True:
            try:
                compile_condition(make(n + 1))
            except ConditionInvalid:
                return make(n)
            n += 1

    kinds = [
        lambda n: "(" * n + "1" + ")" * n + " == 1",
        lambda n: "[" * n + "1" + "]" * n + " != []",
        lambda n: "{1: " * n + "1" + "}" * n + " != {}",
        lambda n: "!" * (2 * n) + "true",
        lambda n: " + ".join(["1"] * n) + " > 0",
        lambda n: " || ".join(["false"] * n) + " || true",
        lambda n: "size(" * n + "[1]" + ")" * n + " == 1",
        lambda n: "args" + ".a" * n + " == 1",
    ]
    texts = [deepest(make) for make in kinds]

    def at_depth(frames: int, text: str):
        if frames:
            return at_depth(frames - 1, text)
        return evaluate(text, args={}, run={})

    for text in texts:
        try:
            holds = at_depth(300, text)
        except ConditionFailed as exc:
            assert "nests too deep" not in str(exc), text[:60]
        else:
            assert holds in (True, False)
    assert MAX_DEPTH == 200


@pytest.mark.django_db
def test_the_api_refuses_macros_nested_too_deeply_at_the_field():
    client = session_client(rule_manager())
    condition = "args.a.all(x, args.b.all(y, args.c.all(z, z > y)))"
    response = post_json(client, "/api/rules", {**SMALL_REFUNDS, "condition": condition})
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.startswith("condition: the condition nests macros too deeply at 'all'")
    assert f"(line 1, column {condition.rindex('all') + 1})" in detail
    assert not Rule.objects.exists()


# -- stopped on a call -----------------------------------------------------------------------


def test_a_condition_that_would_take_minutes_is_stopped_within_the_budget():
    took, outcome = elapsed(QUADRATIC, XS)
    assert isinstance(outcome, ConditionOverBudget), outcome
    assert "took longer than 100 ms" in str(outcome)
    assert EVALUATION_SECONDS <= took < EVALUATION_SECONDS + SLACK


def test_the_budget_is_what_stops_it(monkeypatch):
    """With a budget of half a second it runs half a second: only the budget ends it."""
    monkeypatch.setattr(conditions, "EVALUATION_SECONDS", 0.5)
    took, outcome = elapsed(QUADRATIC, XS)
    assert isinstance(outcome, ConditionOverBudget)
    assert 0.5 <= took < 0.5 + SLACK


def test_a_stopped_evaluation_never_matches_even_where_or_true_would():
    """CEL's || ignores an error on one side when the other is true; a stop is no such
    error, and `exists` does not go on after it."""
    took, outcome = elapsed("args.xs.exists(x, args.xs.exists(y, x == -y - 1)) || true", XS)
    assert isinstance(outcome, ConditionOverBudget)
    assert took < EVALUATION_SECONDS + SLACK


def test_a_value_doubled_by_plus_is_stopped_before_it_takes_the_memory():
    took, outcome = elapsed('args.xs.reduce(r, x, "ab", r + r).size() > 0', {"xs": [0] * 64})
    assert isinstance(outcome, ConditionOverBudget)
    assert "+ built more than" in str(outcome)
    assert took < EVALUATION_SECONDS + SLACK
    assert evaluate(
        'args.xs.reduce(r, x, "ab", r + r).size() == 2048', args={"xs": [0] * 10}, run={}
    )


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"xs": list(range(MAX_ARGUMENT_VALUES))}, "values"),
        ({"s": "x" * (MAX_ARGUMENT_CHARS + 1)}, "characters"),
    ],
)
def test_arguments_over_the_bounds_do_not_match(args, why):
    with pytest.raises(ConditionOverBudget, match=why):
        evaluate("true", args=args, run={})


def test_arguments_nested_too_deep_do_not_match():
    def nested(levels: int) -> dict:  # the arguments' dict is a level, each list one more
        value: object = 1
        for _ in range(levels - 2):
            value = [value]
        return {"a": value}

    assert evaluate("true", args=nested(MAX_ARGUMENT_DEPTH), run={}) is True
    with pytest.raises(ConditionOverBudget, match="levels deep"):
        evaluate("true", args=nested(MAX_ARGUMENT_DEPTH + 1), run={})


def test_arguments_within_the_bounds_are_evaluated_as_before():
    items = [{"price": i % 90, "sku": f"S-{i}"} for i in range(300)]
    assert evaluate("args.items.all(i, i.price < 100)", args={"items": items}, run={}) is True
    assert evaluate("size(args.s) > 0", args={"s": "x" * (MAX_ARGUMENT_CHARS - 1)}, run={}) is True


def test_duration_text_that_backtracks_is_refused_at_once():
    """cel-python's own duration pattern takes seconds on 24 letters and a '!', doubling with
    each letter more."""
    took, outcome = elapsed('duration(args.s) > duration("1s")', {"s": "a" * 60 + "!"})
    assert isinstance(outcome, ConditionFailed)
    assert took < 0.05
    for text, holds in [("1h30m", True), ("-1.5s", False), (".5ms", False), ("+2h", True)]:
        condition = 'duration(args.d) > duration("1h")'
        assert evaluate(condition, args={"d": text}, run={}) is holds


@pytest.mark.django_db
def test_a_condition_over_budget_does_not_match_is_logged_and_the_run_halts(monkeypatch, caplog):
    monkeypatch.setattr(conditions, "EVALUATION_SECONDS", 0.0)  # every evaluation is over
    rule = Rule.objects.create(
        name="small refunds", effect="approve", condition="args.amount <= 50"
    )
    with caplog.at_level(logging.WARNING, logger="approvals.execution.rules"):
        run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.status == "pending", run.error
    row = run.requests.get()
    assert row.state == ApprovalRequest.State.PENDING and row.decided_by_rule is None
    logged = [r.getMessage() for r in caplog.records]
    assert any(
        f"rule {rule.pk} (small refunds) could not be evaluated" in m and "stopped" in m
        for m in logged
    ), logged
    monkeypatch.setattr(conditions, "EVALUATION_SECONDS", 0.1)
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.status == "done", run.error
