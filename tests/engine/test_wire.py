"""Request / Answer wire shapes: pinned vectors, field-naming errors, properties."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolnexus import Answer, Request, ToolResult, pending, pending_of

REQUEST_VECTOR = '{"id":"r1","kind":"input","prompt":"p","url":"u","data":{"k":"v"},"expiresAt":"2026-01-01T00:00:00Z"}'
ANSWER_VECTOR = '{"id":"r1","ok":true,"data":{"k":"v"}}'


def compact(d):
    return json.dumps(d, separators=(",", ":"))


def test_pinned_vectors_round_trip_byte_for_byte():
    assert compact(Request.from_dict(json.loads(REQUEST_VECTOR)).to_dict()) == REQUEST_VECTOR
    assert compact(Answer.from_dict(json.loads(ANSWER_VECTOR)).to_dict()) == ANSWER_VECTOR
    assert Request.from_dict(json.loads(REQUEST_VECTOR)).to_json() == REQUEST_VECTOR


def test_python_attributes_are_snake_case_wire_keys_are_not():
    req = Request.from_dict(json.loads(REQUEST_VECTOR))
    assert req.expires_at == "2026-01-01T00:00:00Z"
    assert list(req.to_dict()) == ["id", "kind", "prompt", "url", "data", "expiresAt"]


def test_optional_keys_are_omitted_when_absent_or_empty():
    assert Request(id="r", kind="approval", prompt="ok?", data={}).to_dict() == {
        "id": "r",
        "kind": "approval",
        "prompt": "ok?",
    }
    assert Request(id="r", kind="x", prompt="").to_json() == '{"id":"r","kind":"x","prompt":""}'
    assert Answer(id="r", ok=False).to_json() == '{"id":"r","ok":false}'
    assert Answer(id="r", ok=True, data={}, reason="").to_dict() == {"id": "r", "ok": True}


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ([], "Request must be a JSON object"),
        ({}, "Request.id"),
        ({"id": 3, "kind": "x"}, "Request.id"),
        ({"id": "", "kind": "x"}, "Request.id"),
        ({"id": "r"}, "Request.kind"),
        ({"id": "r", "kind": "x", "prompt": 5}, "Request.prompt"),
        ({"id": "r", "kind": "x", "url": ["u"]}, "Request.url"),
        ({"id": "r", "kind": "x", "data": "nope"}, "Request.data"),
        ({"id": "r", "kind": "x", "expiresAt": "tomorrow"}, "Request.expiresAt"),
        ({"id": "r", "kind": "x", "expiresAt": "2026-01-01T00:00:00"}, "Request.expiresAt"),
    ],
)
def test_request_from_dict_names_the_bad_field(payload, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Request.from_dict(payload)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ("x", "Answer must be a JSON object"),
        ({"ok": True}, "Answer.id"),
        ({"id": "r"}, "Answer.ok"),
        ({"id": "r", "ok": "yes"}, "Answer.ok"),
        ({"id": "r", "ok": 1}, "Answer.ok"),
        ({"id": "r", "ok": True, "data": [1]}, "Answer.data"),
        ({"id": "r", "ok": False, "reason": 7}, "Answer.reason"),
    ],
)
def test_answer_from_dict_names_the_bad_field(payload, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Answer.from_dict(payload)


def test_pending_builds_a_suspension_with_generated_unique_ids():
    results = [pending(kind="approval", prompt="ok?") for _ in range(200)]
    ids = {pending_of(r).id for r in results}
    assert len(ids) == 200
    r = pending(kind="authorization", prompt="log in", url="https://x/login", id="fixed")
    assert (r.output, r.is_error) == ("log in\nhttps://x/login", True)
    assert pending_of(r) == Request(
        id="fixed", kind="authorization", prompt="log in", url="https://x/login"
    )
    assert pending_of(ToolResult("plain")) is None
    assert (
        pending_of(ToolResult("x", metadata={"pending": {"id": "dict-is-not-a-request"}})) is None
    )


def test_expiry_is_judged_from_expires_at():
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert Request(id="a", kind="x", expires_at=past).is_expired()
    assert not Request(id="b", kind="x", expires_at=future).is_expired()
    assert not Request(id="c", kind="x").is_expired()


# -- properties ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
wire_keys = st.sampled_from(["id", "kind", "prompt", "url", "data", "expiresAt", "ok", "reason"])
wire_like = st.dictionaries(
    wire_keys,
    json_values | st.sampled_from(["r1", "2026-01-01T00:00:00Z", True, False]),
    max_size=8,
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(json_values, wire_like))
def test_from_dict_raises_only_value_error(value):
    for cls in (Request, Answer):
        with contextlib.suppress(ValueError):
            cls.from_dict(value)


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, wire_like))
def test_to_dict_of_from_dict_is_stable(value):
    for cls in (Request, Answer):
        try:
            obj = cls.from_dict(value)
        except ValueError:
            continue
        once = obj.to_dict()
        again = cls.from_dict(json.loads(json.dumps(once))).to_dict()
        assert compact(again) == compact(once)
