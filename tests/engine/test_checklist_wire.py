"""Checklist: Request/Answer wire data, pending(), the answer helpers, relay data."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolnexus import Answer, Request, ToolResult, pending, pending_of
from toolnexus.relay import (
    RelayCall,
    RelayResult,
    answer_declined,
    answer_output,
    is_relay_request,
    relay_answer,
    relay_calls_of,
)

REQ_VECTOR = (
    '{"id":"r1","kind":"input","prompt":"p","url":"u","data":{"k":"v"},'
    '"expiresAt":"2026-01-01T00:00:00Z"}'
)
ANS_VECTOR = '{"id":"r1","ok":true,"data":{"k":"v"}}'


def compact(d: dict) -> str:
    return json.dumps(d, separators=(",", ":"))


# -- pinned vectors ----------------------------------------------------------------------


def test_request_pinned_vector_round_trips_byte_for_byte():
    req = Request.from_dict(json.loads(REQ_VECTOR))
    assert req.expires_at == "2026-01-01T00:00:00Z"
    assert compact(req.to_dict()) == REQ_VECTOR


def test_answer_pinned_vector_round_trips_byte_for_byte():
    ans = Answer.from_dict(json.loads(ANS_VECTOR))
    assert ans.ok is True and ans.data == {"k": "v"}
    assert compact(ans.to_dict()) == ANS_VECTOR


def test_request_key_order_is_fixed_whatever_the_input_order():
    d = {
        "expiresAt": "2026-01-01T00:00:00Z",
        "data": {"k": "v"},
        "url": "u",
        "prompt": "p",
        "kind": "input",
        "id": "r1",
    }
    assert compact(Request.from_dict(d).to_dict()) == REQ_VECTOR


def test_request_omits_absent_url_data_expires_at():
    req = Request(id="r1", kind="approval", prompt="ok?")
    assert list(req.to_dict()) == ["id", "kind", "prompt"]


def test_request_omits_empty_data():
    assert "data" not in Request(id="r1", kind="input", prompt="p", data={}).to_dict()


def test_request_keeps_an_empty_prompt():
    assert Request(id="r1", kind="input", prompt="").to_dict()["prompt"] == ""


def test_answer_omits_empty_reason_and_absent_data_but_keeps_ok_false():
    assert compact(Answer(id="r1", ok=False).to_dict()) == '{"id":"r1","ok":false}'
    assert compact(Answer(id="r1", ok=True, data={}).to_dict()) == '{"id":"r1","ok":true}'


def test_answer_with_reason_serialises_keys_in_order():
    d = Answer(id="r1", ok=False, reason="expired").to_dict()
    assert compact(d) == '{"id":"r1","ok":false,"reason":"expired"}'


def test_to_json_is_compact():
    assert Request.from_dict(json.loads(REQ_VECTOR)).to_json() == REQ_VECTOR
    assert Answer.from_dict(json.loads(ANS_VECTOR)).to_json() == ANS_VECTOR


# -- malformed input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"kind": "input", "prompt": "p"}, "id"),
        ({"id": "r1", "prompt": "p"}, "kind"),
        ({"id": "r1", "kind": 5, "prompt": "p"}, "kind"),
        ({"id": "r1", "kind": "input", "prompt": "p", "data": [1, 2]}, "data"),
        ({"id": "r1", "kind": "input", "prompt": "p", "url": 7}, "url"),
        ({"id": "r1", "kind": "input", "prompt": "p", "expiresAt": 5}, "expiresAt"),
    ],
)
def test_request_from_dict_rejects_malformed_field_with_value_error_naming_it(bad, field):
    with pytest.raises(ValueError, match=field):
        Request.from_dict(bad)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"ok": True}, "id"),
        ({"id": "r1"}, "ok"),
        ({"id": "r1", "ok": "yes"}, "ok"),
        ({"id": "r1", "ok": True, "data": "x"}, "data"),
        ({"id": "r1", "ok": False, "reason": 3}, "reason"),
    ],
)
def test_answer_from_dict_rejects_malformed_field_with_value_error_naming_it(bad, field):
    with pytest.raises(ValueError, match=field):
        Answer.from_dict(bad)


@pytest.mark.parametrize("bad", [None, "r1", 5, ["id"]])
def test_from_dict_rejects_non_objects_with_value_error(bad):
    with pytest.raises(ValueError):
        Request.from_dict(bad)
    with pytest.raises(ValueError):
        Answer.from_dict(bad)


# -- properties ----------------------------------------------------------------------------

_text = st.text(max_size=12)
_data = st.none() | st.dictionaries(
    st.text(min_size=1, max_size=6),
    st.one_of(st.integers(), _text, st.booleans()),
    min_size=1,
    max_size=3,
)


@given(
    id=st.text(min_size=1, max_size=12),
    kind=st.sampled_from(["input", "approval", "question", "authorization", "tool_call"]),
    prompt=_text,
    url=st.none() | st.text(min_size=1, max_size=12),
    data=_data,
    expires_at=st.none() | st.just("2030-05-06T07:08:09Z"),
)
def test_request_json_round_trip_preserves_every_field(id, kind, prompt, url, data, expires_at):
    req = Request(id=id, kind=kind, prompt=prompt, url=url, data=data, expires_at=expires_at)
    wire = json.loads(json.dumps(req.to_dict()))
    order = [k for k in ["id", "kind", "prompt", "url", "data", "expiresAt"] if k in wire]
    assert list(wire) == order
    assert Request.from_dict(wire) == req


@given(
    id=st.text(min_size=1, max_size=12),
    ok=st.booleans(),
    data=_data,
    reason=st.sampled_from(["", "declined", "cancelled", "expired", "too risky"]),
)
def test_answer_json_round_trip_preserves_every_field(id, ok, data, reason):
    ans = Answer(id=id, ok=ok, data=data, reason=reason)
    wire = json.loads(json.dumps(ans.to_dict()))
    assert list(wire) == [k for k in ["id", "ok", "data", "reason"] if k in wire]
    back = Answer.from_dict(wire)
    assert (back.id, back.ok, back.data, back.reason or "") == (id, ok, data, reason)


# -- pending() / pending_of() -------------------------------------------------------------


def test_pending_builds_a_suspension_result_carrying_its_request():
    res = pending(
        kind="authorization",
        prompt="Log in",
        url="https://login.test/x",
        id="r9",
        data={"scope": "read"},
        expires_at="2030-01-01T00:00:00Z",
    )
    req = pending_of(res)
    assert isinstance(res, ToolResult)
    assert res.output == "Log in\nhttps://login.test/x"
    assert isinstance(req, Request)
    assert (req.id, req.kind, req.prompt, req.url) == (
        "r9",
        "authorization",
        "Log in",
        "https://login.test/x",
    )
    assert req.data == {"scope": "read"}
    assert req.expires_at == "2030-01-01T00:00:00Z"


def test_pending_generates_unique_ids_when_omitted():
    ids = {pending_of(pending(kind="input", prompt="p")).id for _ in range(50)}
    assert len(ids) == 50 and all(isinstance(i, str) and i for i in ids)


def test_pending_of_is_none_for_an_ordinary_result():
    assert pending_of(ToolResult(output="x")) is None
    assert pending_of(ToolResult(output="x", is_error=True, metadata={"other": 1})) is None


# -- answer helpers (the seeds) ----------------------------------------------------------


def test_answer_output_wraps_output_in_data():
    a = answer_output("r1", "approved")
    assert (a.id, a.ok, a.data, a.reason) == ("r1", True, {"output": "approved"}, "")
    assert compact(a.to_dict()) == '{"id":"r1","ok":true,"data":{"output":"approved"}}'


def test_answer_output_marks_is_error_inside_data_only_when_set():
    a = answer_output("r1", "boom", is_error=True)
    assert a.data == {"output": "boom", "isError": True}
    assert "isError" not in answer_output("r1", "fine").data


def test_answer_declined_keeps_a_free_text_reason():
    a = answer_declined("req-1", "amount exceeds refund policy")
    assert (a.id, a.ok, a.data, a.reason) == ("req-1", False, None, "amount exceeds refund policy")


def test_answer_declined_defaults_an_empty_reason_to_declined():
    assert answer_declined("req-2", "").reason == "declined"
    assert answer_declined("req-3").reason == "declined"
    assert compact(answer_declined("r").to_dict()) == '{"id":"r","ok":false,"reason":"declined"}'


def test_relay_answer_emits_one_entry_per_result_with_all_keys():
    a = relay_answer("r1", [RelayResult("c1", "one"), RelayResult("c2", "two", is_error=True)])
    assert a.ok is True and a.id == "r1"
    assert a.data == {
        "results": [
            {"id": "c1", "output": "one", "isError": False},
            {"id": "c2", "output": "two", "isError": True},
        ]
    }


def test_relay_calls_of_reads_data_calls_into_relay_calls():
    req = Request(
        id="r",
        kind="tool_call",
        prompt="p",
        data={
            "calls": [
                {"id": "c1", "name": "alpha", "input": {"x": 1}, "arguments": '{"x": 1}'},
                {"id": "c2", "name": "beta", "input": {}, "arguments": "{}"},
            ]
        },
    )
    assert is_relay_request(req)
    got = relay_calls_of(req)
    assert got == [
        RelayCall("c1", "alpha", {"x": 1}, '{"x": 1}'),
        RelayCall("c2", "beta", {}, "{}"),
    ]


def test_relay_calls_of_is_empty_for_a_non_relay_request():
    req = Request(id="r", kind="authorization", prompt="p", url="u")
    assert not is_relay_request(req)
    assert relay_calls_of(req) == []
