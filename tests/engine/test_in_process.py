"""toolnexus.in_process: a Python function plays the model (no URL, no socket)."""

from __future__ import annotations

import json

import pytest

from tests.engine.helpers import ADD_SCHEMA, Gate, Probe, collect, kit
from toolnexus import (
    Answer,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    ModelError,
    create_in_process_client,
)
from toolnexus.in_process import InProcessModel, reply_of


def adder():
    return Probe("add", output=lambda a: str(a["a"] + a["b"]), schema=ADD_SCHEMA)


async def test_in_process_needs_no_url_or_key_and_sees_messages_tools_model(monkeypatch):
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    seen = []

    def generate(req):
        seen.append((req.model, json.loads(json.dumps(req.messages)), req.tools))
        return {"content": "hi there"}

    client = create_in_process_client(generate=generate, model="local-1", system_prompt="sys")
    async with await kit(adder()) as tk:
        r = await client.run("hello", tk)
    assert r.status == "done" and r.text == "hi there" and r.model == "local-1"
    model, messages, tools = seen[0]
    assert model == "local-1"
    assert messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    assert tools[0]["function"]["name"] == "add"


@pytest.mark.parametrize("arguments", [{"a": 2, "b": 3}, '{"a": 2, "b": 3}'])
async def test_in_process_arguments_may_be_a_dict_or_a_json_string(arguments):
    add = adder()
    replies = iter(
        [
            {"tool_calls": [{"id": "k1", "name": "add", "arguments": arguments}]},
            {"content": "5"},
        ]
    )
    client = create_in_process_client(generate=lambda req: next(replies))
    async with await kit(add) as tk:
        r = await client.run("go", tk)
    assert r.status == "done" and add.runs[0][0] == {"a": 2, "b": 3}
    assert r.tool_calls[0]["output"] == "5"


async def test_in_process_missing_ids_become_call_index():
    add = adder()
    seen = []

    def generate(req):
        seen.append(json.loads(json.dumps(req.messages)))
        if len(seen) == 1:
            return {
                "tool_calls": [
                    {"name": "add", "arguments": {"a": 1, "b": 1}},
                    {"name": "add", "arguments": {"a": 2, "b": 2}},
                ]
            }
        return {"content": "done"}

    client = create_in_process_client(generate=generate)
    async with await kit(add) as tk:
        await client.run("go", tk)
    assert sorted(ctx.call_id for _, ctx in add.runs) == ["call_0", "call_1"]
    tool_msgs = [m for m in seen[1] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_msgs] == [
        ("call_0", "2"),
        ("call_1", "4"),
    ]


async def test_in_process_accepts_dataclass_responses_and_async_generate():
    add = adder()
    n = {"i": 0}

    async def generate(req):
        n["i"] += 1
        if n["i"] == 1:
            return InProcessResponse(
                content=None,
                tool_calls=[InProcessToolCall("k1", "add", {"a": 4, "b": 4})],
                usage={"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
            )
        return InProcessResponse(
            content="8",
            tool_calls=[],
            usage={"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        )

    client = create_in_process_client(generate=generate)
    async with await kit(add) as tk:
        r = await client.run("go", tk)
    assert r.status == "done" and r.text == "8"
    assert r.usage == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


async def test_in_process_usage_is_zero_when_absent():
    client = create_in_process_client(generate=lambda req: {"content": "x"})
    async with await kit(adder()) as tk:
        r = await client.run("go", tk)
    assert r.usage == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


async def test_in_process_options_apply_max_turns_wait_for_and_hooks():
    gate = Gate("login")
    before = []
    replies = iter(
        [{"tool_calls": [{"id": "c1", "name": "login", "arguments": {}}]}, {"content": "in"}]
    )
    client = create_in_process_client(
        generate=lambda req: next(replies),
        max_turns=3,
        wait_for=lambda q: Answer(id=q.id, ok=True),
        hooks={"before_tool": lambda i: before.append(i["name"])},
    )
    async with await kit(gate) as tk:
        r = await client.run("go", tk)
    assert r.status == "done" and gate.done == 1 and before == ["login"]


def test_in_process_requires_generate():
    with pytest.raises(TypeError):
        create_in_process_client()


# -- what generate may return ----------------------------------------------------------------


def test_reply_of_a_plain_string_is_the_final_text():
    assert reply_of("hello") == {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ]
    }


def test_reply_of_reads_camel_case_keys_and_fills_the_total():
    reply = reply_of(
        {
            "toolCalls": [{"id": "k", "name": "add", "arguments": {"a": 1}}],
            "usage": {"promptTokens": 4, "completionTokens": 2},
        }
    )
    (choice,) = reply["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {"id": "k", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
    ]
    assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


@pytest.mark.parametrize("bad", [42, None, {"tool_calls": [7]}])
def test_reply_of_refuses_what_is_not_a_reply(bad):
    with pytest.raises(ModelError, match="generate returned"):
        reply_of(bad)


async def test_generate_sees_an_in_process_request_with_the_body():
    seen: list[InProcessRequest] = []

    def generate(req: InProcessRequest) -> str:
        seen.append(req)
        return "ok"

    async with await kit(adder()) as tk:
        await create_in_process_client(generate=generate, model="m1").run("hi", tk)
    (req,) = seen
    assert req.model == "m1" and req.body["model"] == "m1"
    assert req.messages is req.body["messages"] and req.tools == req.body["tools"]
    assert "stream" not in req.body  # never a streaming body: there is no wire


# -- failures and retries --------------------------------------------------------------------


async def test_a_failing_generate_is_a_model_error_not_retried_by_default():
    calls = 0

    def generate(req):
        nonlocal calls
        calls += 1
        raise RuntimeError("model crashed")

    async with await kit(adder()) as tk:
        with pytest.raises(ModelError, match="generate failed: RuntimeError: model crashed"):
            await create_in_process_client(generate=generate).run("go", tk)
    assert calls == 1


async def test_a_failing_generate_is_retried_when_retries_are_given():
    outcomes = [RuntimeError("flaky"), RuntimeError("flaky"), "fine"]

    def generate(req):
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    async with await kit(adder()) as tk:
        client = create_in_process_client(generate=generate, retries=2, retry_base_ms=1)
        assert (await client.run("go", tk)).text == "fine"
    assert outcomes == []


async def test_a_wrong_return_type_is_not_retried():
    calls = 0

    def generate(req):
        nonlocal calls
        calls += 1
        return 42

    async with await kit(adder()) as tk:
        with pytest.raises(ModelError, match="generate returned int"):
            await create_in_process_client(generate=generate, retries=3).run("go", tk)
    assert calls == 1


async def test_streaming_emits_the_text_once_as_one_delta():
    client = create_in_process_client(generate=lambda req: "all at once")
    async with await kit(adder()) as tk:
        events = await collect(client.stream("go", tk))
    assert [e["delta"] for e in events if e["type"] == "text"] == ["all at once"]
    assert events[-1]["type"] == "done"


@pytest.mark.parametrize("option", ["base_url", "api_key", "style", "http_client", "headers"])
def test_wire_options_are_refused(option):
    with pytest.raises(TypeError, match=option):
        create_in_process_client(generate=lambda req: "x", **{option: "v"})


async def test_the_backend_has_nothing_to_close():
    model = InProcessModel(lambda req: "x", model="m")
    assert model.streams is False and model.dialect.name == "openai"
    await model.aclose()
