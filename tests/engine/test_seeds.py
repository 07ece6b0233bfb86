"""The seed documents' six examples (Go and Rust), translated one for one to Python."""

from __future__ import annotations

import json

import pytest

from toolnexus import (
    InProcessResponse,
    InProcessToolCall,
    create_client,
    create_in_process_client,
    create_toolkit,
)
from toolnexus.relay import answer_declined, answer_output, relay_tool

from .stub_server import StubModelServer

REASON = "amount exceeds refund policy"


# -- example 1: the smallest useful call ---------------------------------------------------


def test_example_1_answer_shape_and_default_reason():
    ans = answer_declined("req-1", "not authorized")
    assert ans.id == "req-1"
    assert not ans.ok
    assert ans.reason == "not authorized"

    default = answer_declined("req-2", "")
    assert default.reason == "declined"
    assert answer_declined("req-3").reason == "declined"


# -- example 2: decline a relayed call and let the run finish anyway -------------------------


def _openai_stub_reply(body, turn):
    if turn == 1:
        return {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "refund", "arguments": "{}"},
                            }
                        ],
                    }
                }
            ],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
        }
    return {
        "choices": [{"message": {"role": "assistant", "content": "understood, no refund issued"}}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }


async def test_example_2_decline_relayed_call_over_real_http_stub():
    with StubModelServer(_openai_stub_reply) as srv:
        refund = relay_tool("refund", "issue a refund", None)
        async with await create_toolkit(builtins=False, extra_tools=[refund]) as tk:
            async with create_client(
                base_url=srv.url, style="openai", model="stub", api_key="k"
            ) as client:
                halted = await client.run("refund the customer", tk)
                assert halted.status == "pending", "expected a durable halt"

                # The approver said no: the run still completes, it just knows it was refused.
                resumed = await client.run_with_answer(
                    tk, halted.messages, halted.pending, answer_declined(halted.pending.id, REASON)
                )
        assert resumed.status == "done"
        assert "no refund" in resumed.text

    assert len(srv.bodies) == 2
    assert srv.paths == ["/chat/completions", "/chat/completions"]
    assert srv.headers[0]["authorization"] == "Bearer k"
    # The reason reached the model on the resumed turn, bound to the original call id.
    tool_msgs = [m for m in srv.bodies[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs == [
        {"role": "tool", "tool_call_id": "c1", "content": f"relay declined for refund: {REASON}"}
    ]
    assert resumed.usage == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}


def _in_process_model(seen):
    def model(req):
        seen.append(json.loads(json.dumps(req.messages)))
        if any(m["role"] == "tool" for m in req.messages):
            return InProcessResponse(content="understood, no refund issued")
        return InProcessResponse(
            tool_calls=[InProcessToolCall(id="c1", name="refund", arguments={})]
        )

    return model


async def test_example_2_decline_relayed_call_in_process():
    seen: list = []
    tk = await create_toolkit(
        builtins=False, extra_tools=[relay_tool("refund", "issue a refund", None)]
    )
    client = create_in_process_client(generate=_in_process_model(seen))

    halted = await client.run("refund the customer", tk)
    assert halted.status == "pending", "expected a durable halt"
    req = halted.pending

    resumed = await client.run_with_answer(
        tk, halted.messages, req, answer_declined(req.id, REASON)
    )
    assert resumed.status == "done"
    assert "no refund" in resumed.text, resumed.text
    last_request_tools = [m for m in seen[-1] if m["role"] == "tool"]
    assert last_request_tools[0]["content"] == f"relay declined for refund: {REASON}"
    assert last_request_tools[0]["tool_call_id"] == "c1"


def test_example_2_blocking_twins():
    seen: list = []
    import asyncio

    tk = asyncio.run(
        create_toolkit(builtins=False, extra_tools=[relay_tool("refund", "issue a refund")])
    )
    client = create_in_process_client(generate=_in_process_model(seen))
    halted = client.run_sync("refund the customer", tk)
    resumed = client.run_with_answer_sync(
        tk, halted.messages, halted.pending, answer_declined(halted.pending.id, REASON)
    )
    assert (halted.status, resumed.status) == ("pending", "done")


# -- example 3: a decline against a successful answer for the same call -----------------------


def test_example_3_decline_versus_output():
    declined = answer_declined("req-1", "")
    output = answer_output("req-1", "approved")

    assert not declined.ok, "a decline must carry ok: false"
    assert output.ok, "a real output must carry ok: true"
    assert declined.data is None, "a decline carries no payload"
    assert output.reason == "", "a success carries no reason"
    assert declined.to_json() == '{"id":"req-1","ok":false,"reason":"declined"}'
    assert output.to_json() == '{"id":"req-1","ok":true,"data":{"output":"approved"}}'
    assert answer_output("r", "boom", is_error=True).to_dict()["data"] == {
        "output": "boom",
        "isError": True,
    }


@pytest.mark.parametrize(
    "reason", ["not authorized", "amount exceeds refund policy", "x" * 2000, "émoji ✓"]
)
def test_free_text_reasons_survive_the_wire(reason):
    from toolnexus import Answer

    ans = answer_declined("r", reason)
    assert Answer.from_dict(json.loads(ans.to_json())) == ans
