"""approvals.domain.jsonvalues: what people may send, and a model's deep values cut to show."""

from __future__ import annotations

import pytest

from approvals.domain.jsonvalues import (
    MAX_DEPTH,
    TOO_DEEP,
    cut_deep,
    holds_cut,
    strict_json_loads,
)


def _nested(levels: int, leaf=1):
    value = leaf
    for n in range(levels):
        value = {"k": value} if n % 2 else [value]
    return value


def _depth(value) -> int:
    depth = 0
    while isinstance(value, (dict, list)):
        value = value["k"] if isinstance(value, dict) else value[0]
        depth += 1
    return depth


def test_a_value_within_the_limit_is_returned_as_it_is():
    value = {"b": [1, {"c": "x"}], "a": None}
    assert cut_deep(value) == (value, False)
    assert cut_deep(value)[0] is value
    assert cut_deep(_nested(MAX_DEPTH))[1] is False
    assert not holds_cut(value)


def test_a_deeper_value_is_cut_at_the_limit_keeping_order_and_siblings():
    deep = {"z": 1, "deep": _nested(5000), "a": [1, 2]}  # past any recursion limit
    cut, was_cut = cut_deep(deep)
    assert was_cut and holds_cut(cut)
    assert list(cut) == ["z", "deep", "a"] and cut["z"] == 1 and cut["a"] == [1, 2]
    assert _depth(cut["deep"]) == MAX_DEPTH - 1  # the top object is the first level
    inner = cut["deep"]
    while isinstance(inner, (dict, list)):
        inner = inner["k"] if isinstance(inner, dict) else inner[0]
    assert inner == TOO_DEEP
    # what is stored passes the limit people's input is held to
    import json

    assert strict_json_loads(json.dumps(cut)) == cut
    assert deep["deep"] is not cut["deep"]  # the original is untouched


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 200])
def test_people_still_may_not_send_deeper_values(levels):
    import json

    with pytest.raises(ValueError, match="nested more than"):
        strict_json_loads(json.dumps(_nested(levels)))
