"""Checklist: the MCP elicitation bridge (Request <-> MCP elicitation shapes)."""

from __future__ import annotations

import pytest

from tests.engine.helpers import field_of
from toolnexus import Answer, Request
from toolnexus.mcp import answer_to_elicit_result, elicitation_to_request
from toolnexus.relay import answer_declined, answer_output

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "number"}},
    "required": ["name"],
}


class ParamsObject:
    """Stands in for the MCP SDK's params object (attribute access + model_dump)."""

    def __init__(self, **kw):
        self._kw = kw
        for k, v in kw.items():
            setattr(self, k, v)

    def model_dump(self, *args, **kwargs):
        return dict(self._kw)


def test_form_elicitation_becomes_input_with_schema_in_data():
    req = elicitation_to_request({"message": "Your name?", "requestedSchema": SCHEMA})
    assert isinstance(req, Request)
    assert (req.kind, req.prompt, req.url) == ("input", "Your name?", None)
    assert req.data == {"schema": SCHEMA}
    assert isinstance(req.id, str) and req.id


def test_form_elicitation_from_an_sdk_params_object():
    req = elicitation_to_request(ParamsObject(message="Your name?", requestedSchema=SCHEMA))
    assert (req.kind, req.prompt) == ("input", "Your name?")
    assert req.data == {"schema": SCHEMA}


def test_explicit_form_mode_is_input():
    req = elicitation_to_request({"mode": "form", "message": "m", "requestedSchema": SCHEMA})
    assert req.kind == "input" and req.data == {"schema": SCHEMA}


def test_url_elicitation_becomes_authorization_with_url_and_no_data():
    req = elicitation_to_request(
        {
            "mode": "url",
            "message": "Log in to continue",
            "url": "https://auth.test/x",
            "elicitationId": "e1",
        }
    )
    assert (req.kind, req.prompt, req.url) == (
        "authorization",
        "Log in to continue",
        "https://auth.test/x",
    )
    assert not req.data
    assert "data" not in req.to_dict()


def test_url_elicitation_never_carries_a_schema():
    req = elicitation_to_request(
        {"mode": "url", "message": "m", "url": "https://a.test", "requestedSchema": SCHEMA}
    )
    assert req.kind == "authorization" and not (req.data or {}).get("schema")


def test_each_elicitation_gets_a_fresh_id():
    a = elicitation_to_request({"message": "m"})
    b = elicitation_to_request({"message": "m"})
    assert a.id != b.id


def test_ok_answer_with_data_is_accept_with_content():
    res = answer_to_elicit_result(Answer(id="r", ok=True, data={"name": "Ada"}))
    assert field_of(res, "action") == "accept"
    assert field_of(res, "content") == {"name": "Ada"}


def test_ok_answer_without_data_is_accept_with_empty_content():
    res = answer_to_elicit_result(Answer(id="r", ok=True))
    assert field_of(res, "action") == "accept"
    assert field_of(res, "content") == {}


def test_answer_output_helper_is_accepted_as_accept():
    res = answer_to_elicit_result(answer_output("r", "fine"))
    assert field_of(res, "action") == "accept"
    assert field_of(res, "content") == {"output": "fine"}


def test_declined_reason_is_decline():
    assert field_of(answer_to_elicit_result(answer_declined("r")), "action") == "decline"
    res = answer_to_elicit_result(Answer(id="r", ok=False, reason="declined"))
    assert field_of(res, "action") == "decline"
    assert not field_of(res, "content")


@pytest.mark.parametrize("reason", ["", "cancelled", "expired", "amount exceeds refund policy"])
def test_any_other_refusal_is_cancel(reason):
    res = answer_to_elicit_result(Answer(id="r", ok=False, reason=reason))
    assert field_of(res, "action") == "cancel"
    assert not field_of(res, "content")


def test_free_text_decline_from_the_helper_is_cancel_not_decline():
    res = answer_to_elicit_result(answer_declined("r", "not today"))
    assert field_of(res, "action") == "cancel"
