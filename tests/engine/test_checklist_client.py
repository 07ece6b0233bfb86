"""Checklist: the client loop outside suspensions — hooks, retries, deadline, cancel,
wire endpoints, history (the in-process client's own items are in test_in_process.py)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.engine.helpers import (
    ADD_SCHEMA,
    BACKENDS,
    HTTP_STYLES,
    C,
    FakeProvider,
    Gate,
    Probe,
    calls,
    kit,
    say,
    text_of,
)
from toolnexus import (
    Answer,
    ModelError,
    RunCancelled,
    RunTimeout,
    Tool,
    ToolResult,
    create_toolkit,
)

all_backends = pytest.mark.parametrize("backend", BACKENDS)
http_styles = pytest.mark.parametrize("backend", HTTP_STYLES)


def adder():
    return Probe("add", output=lambda a: str(a["a"] + a["b"]), schema=ADD_SCHEMA)


# -- basics ----------------------------------------------------------------------------------


@all_backends
async def test_plain_answer_is_done_with_text_usage_and_model(backend):
    prov = FakeProvider(backend, say("hello", usage=(5, 2)))
    async with await kit(adder()) as tk:
        r = await prov.client().run("hi", tk)
    assert (r.status, r.text, r.turns, r.model, r.limit) == ("done", "hello", 1, "test-model", None)
    assert r.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert r.tool_calls == [] and r.pending is None
    assert json.loads(json.dumps(r.messages)) == r.messages


@all_backends
async def test_tool_call_loops_back_with_results(backend):
    add = adder()
    prov = FakeProvider(backend, calls(C("c1", "add", {"a": 1, "b": 2})), say("3"))
    async with await kit(add) as tk:
        r = await prov.client().run("add", tk)
    assert r.status == "done" and r.turns == 2
    assert prov.results_seen() == {"c1": "3"}
    assert [(t["id"], t["name"], t["args"], t["output"], t["is_error"]) for t in r.tool_calls] == [
        ("c1", "add", {"a": 1, "b": 2}, "3", False)
    ]


@all_backends
async def test_calls_of_a_turn_are_recorded_in_call_order_even_if_run_concurrently(backend):
    async def slow(args, ctx):
        await asyncio.sleep(0.05)
        return ToolResult(output="slow")

    tools = [
        Tool(
            name="slow",
            description="s",
            input_schema={"type": "object"},
            source="native",
            execute=slow,
        ),
        Probe("fast", output="fast").tool,
    ]
    prov = FakeProvider(backend, calls(C("c1", "slow"), C("c2", "fast")), say("ok"))
    async with await create_toolkit(builtins=False, extra_tools=tools) as tk:
        r = await prov.client().run("go", tk)
    assert [t["id"] for t in r.tool_calls] == ["c1", "c2"]
    assert list(prov.results_seen()) == ["c1", "c2"]


@all_backends
async def test_ctx_carries_provider_call_id_and_raw_arguments(backend):
    add = adder()
    raw = '{"a": 1,  "b":2}'
    prov = FakeProvider(backend, calls(C("call_abc", "add", raw)), say("3"))
    async with await kit(add) as tk:
        await prov.client().run("add", tk)
    (args, ctx) = add.runs[0]
    assert args == {"a": 1, "b": 2} and ctx.call_id == "call_abc"
    if backend == "anthropic":
        assert json.loads(ctx.arguments) == {"a": 1, "b": 2}
    else:
        assert ctx.arguments == raw


@all_backends
async def test_unknown_tool_call_feeds_an_error_and_the_run_goes_on(backend):
    prov = FakeProvider(backend, calls(C("c1", "nope")), say("sorry"))
    async with await kit(adder()) as tk:
        r = await prov.client().run("go", tk)
    assert r.status == "done"
    assert prov.results_seen() == {"c1": "Unknown tool: nope"}


@all_backends
async def test_history_continues_a_previous_run(backend):
    prov = FakeProvider(backend, say("first"), say("second"))
    async with await kit(adder()) as tk:
        client = prov.client()
        r1 = await client.run("one", tk)
        r2 = await client.run("two", tk, history=r1.messages)
    assert r2.text == "second"
    sent = json.dumps(prov.last["messages"])
    assert "one" in sent and "first" in sent and "two" in sent


# -- wire ------------------------------------------------------------------------------------


async def test_openai_wire_endpoint_auth_and_body():
    prov = FakeProvider("openai", say("hi"))
    async with await kit(adder()) as tk:
        await prov.client(api_key="sk-1", system_prompt="Be brief").run("hello", tk)
    req = prov.requests[0]
    assert req.method == "POST" and req.url.path == "/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-1"
    body = prov.bodies[0]
    assert body["model"] == "test-model"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "hello"},
    ]
    assert body["tools"][0]["function"]["name"] == "add"


async def test_anthropic_wire_endpoint_auth_and_body():
    prov = FakeProvider("anthropic", say("hi"))
    async with await kit(adder()) as tk:
        await prov.client(api_key="ak-1", system_prompt="Be brief").run("hello", tk)
    req = prov.requests[0]
    assert req.method == "POST" and req.url.path == "/v1/messages"
    assert req.headers["x-api-key"] == "ak-1"
    body = prov.bodies[0]
    assert body["system"] == "Be brief"
    assert [(m["role"], text_of(m["content"])) for m in body["messages"]] == [("user", "hello")]
    assert body["tools"][0]["name"] == "add" and "input_schema" in body["tools"][0]


# -- hooks -----------------------------------------------------------------------------------


@all_backends
async def test_before_llm_and_after_llm_are_called_every_turn(backend):
    before, after = [], []
    hooks = {
        "before_llm": lambda i: before.append(json.loads(json.dumps(i, default=str))),
        "after_llm": lambda i: after.append(i),
    }
    prov = FakeProvider(backend, calls(C("c1", "add", {"a": 1, "b": 1})), say("2"))
    async with await kit(adder()) as tk:
        await prov.client(hooks=hooks).run("go", tk)
    assert len(before) == len(after) == 2
    assert [i["model"] for i in before] == ["test-model", "test-model"]
    assert before[0]["turn"] < before[1]["turn"]
    assert text_of(before[0]["messages"][-1]["content"]) == "go"
    assert all("response" in i for i in after)


@all_backends
async def test_before_tool_can_rewrite_args(backend):
    add = adder()
    hooks = {"before_tool": lambda i: {"args": {"a": 10, "b": 20}} if i["name"] == "add" else None}
    prov = FakeProvider(backend, calls(C("c1", "add", {"a": 1, "b": 2})), say("30"))
    async with await kit(add) as tk:
        await prov.client(hooks=hooks).run("go", tk)
    assert add.runs[0][0] == {"a": 10, "b": 20}
    assert prov.results_seen() == {"c1": "30"}


@all_backends
async def test_before_tool_can_short_circuit_with_a_result(backend):
    add = adder()
    hooks = {"before_tool": lambda i: {"result": ToolResult("blocked by policy", is_error=True)}}
    prov = FakeProvider(backend, calls(C("c1", "add", {"a": 1, "b": 2})), say("blocked"))
    async with await kit(add) as tk:
        r = await prov.client(hooks=hooks).run("go", tk)
    assert add.count == 0
    assert prov.results_seen() == {"c1": "blocked by policy"}
    assert r.tool_calls[0]["is_error"] is True


@all_backends
async def test_after_tool_can_replace_the_result(backend):
    hooks = {"after_tool": lambda i: {"result": ToolResult(output=f"<{i['result'].output}>")}}
    prov = FakeProvider(backend, calls(C("c1", "add", {"a": 1, "b": 2})), say("ok"))
    async with await kit(adder()) as tk:
        r = await prov.client(hooks=hooks).run("go", tk)
    assert prov.results_seen() == {"c1": "<3>"}
    assert r.tool_calls[0]["output"] == "<3>"


@all_backends
async def test_hooks_may_be_an_object_with_async_methods(backend):
    class Hooks:
        def __init__(self):
            self.seen = []

        async def before_llm(self, info):
            self.seen.append("before_llm")

        async def after_llm(self, info):
            self.seen.append("after_llm")

        async def before_tool(self, info):
            self.seen.append(f"before_tool:{info['name']}:{info['id']}")

        async def after_tool(self, info):
            self.seen.append(f"after_tool:{info['name']}")
            return {"result": ToolResult(output="replaced")}

    h = Hooks()
    prov = FakeProvider(backend, calls(C("c1", "add", {"a": 1, "b": 2})), say("ok"))
    async with await kit(adder()) as tk:
        await prov.client(hooks=h).run("go", tk)
    assert h.seen == [
        "before_llm",
        "after_llm",
        "before_tool:add:c1",
        "after_tool:add",
        "before_llm",
        "after_llm",
    ]
    assert prov.results_seen() == {"c1": "replaced"}


@all_backends
async def test_after_tool_is_not_called_for_a_halted_suspension(backend):
    after = []
    prov = FakeProvider(backend, calls(C("c1", "login")))
    async with await kit(Gate("login")) as tk:
        r = await prov.client(hooks={"after_tool": lambda i: after.append(i)}).run("go", tk)
    assert r.status == "pending" and after == []


@all_backends
async def test_path_b_durable_guard_suspension_halts_then_resume_runs_the_tool(backend):
    add = adder()
    count = {"n": 0}

    def before_tool(info):
        count["n"] += 1
        if count["n"] == 1:
            from toolnexus import pending

            return {"result": pending(kind="approval", prompt="May I add?")}
        return None

    prov = FakeProvider(backend, calls(C("c1", "add", {"a": 1, "b": 2})), say("3"))
    async with await kit(add) as tk:
        client = prov.client(hooks={"before_tool": before_tool})
        r1 = await client.run("go", tk)
        assert r1.status == "pending" and r1.pending.kind == "approval"
        assert r1.pending.data["callId"] == "c1" and add.count == 0
        r2 = await client.run_with_answer(
            tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True)
        )
    assert r2.status == "done" and add.count == 1
    assert prov.results_seen() == {"c1": "3"}


# -- retries ---------------------------------------------------------------------------------


def err(status, **headers):
    return httpx.Response(status, headers=headers, json={"error": {"message": f"HTTP {status}"}})


@http_styles
async def test_retries_a_429_with_retry_after_zero(backend):
    prov = FakeProvider(backend, err(429, **{"Retry-After": "0"}), say("hi"))
    async with await kit(adder()) as tk:
        r = await prov.client(retries=2, retry_base_ms=1).run("go", tk)
    assert r.status == "done" and r.text == "hi"
    assert len(prov.bodies) == 2 and prov.bodies[0] == prov.bodies[1]


@http_styles
async def test_retries_a_500_then_succeeds(backend):
    prov = FakeProvider(backend, err(500), say("hi"))
    async with await kit(adder()) as tk:
        r = await prov.client(retries=2, retry_base_ms=1).run("go", tk)
    assert r.status == "done" and len(prov.bodies) == 2


@http_styles
async def test_failure_after_retries_raises_model_error(backend):
    prov = FakeProvider(backend, default=err(500))
    async with await kit(adder()) as tk:
        with pytest.raises(ModelError) as info:
            await prov.client(retries=2, retry_base_ms=1).run("go", tk)
    assert info.value.status == 500
    assert len(prov.bodies) == 3


async def test_retries_zero_means_a_single_attempt():
    prov = FakeProvider("openai", default=err(503))
    async with await kit(adder()) as tk:
        with pytest.raises(ModelError):
            await prov.client(retries=0, retry_base_ms=1).run("go", tk)
    assert len(prov.bodies) == 1


async def test_a_failed_provider_never_yields_a_pending_status():
    prov = FakeProvider("openai", calls(C("c1", "add", {"a": 1, "b": 2})), default=err(500))
    async with await kit(adder()) as tk:
        with pytest.raises(ModelError):
            await prov.client(retries=1, retry_base_ms=1).run("go", tk)


# -- deadline and cancel -------------------------------------------------------------------


@all_backends
async def test_whole_run_timeout_during_a_slow_tool_raises_run_timeout(backend):
    async def slow(args, ctx):
        await asyncio.sleep(0.4)
        return ToolResult(output="late")

    tool = Tool(
        name="slow", description="s", input_schema={"type": "object"}, source="native", execute=slow
    )
    prov = FakeProvider(backend, calls(C("c1", "slow")), say("never"))
    async with await create_toolkit(builtins=False, extra_tools=[tool]) as tk:
        t0 = time.monotonic()
        with pytest.raises(RunTimeout):
            await prov.client(timeout=0.05).run("go", tk)
    assert time.monotonic() - t0 < 0.35


async def test_whole_run_timeout_during_a_slow_provider_raises_run_timeout():
    async def handler(request):
        await asyncio.sleep(0.4)
        return httpx.Response(200, json={})

    from toolnexus import create_client

    client = create_client(
        base_url="http://provider.test",
        style="openai",
        model="m",
        api_key="k",
        timeout=0.05,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )
    async with await kit(adder()) as tk:
        with pytest.raises(RunTimeout):
            await client.run("go", tk)


@all_backends
async def test_run_deadline_interrupts_a_parked_wait_for(backend):
    async def wait_for(q):
        await asyncio.sleep(0.5)
        return Answer(id=q.id, ok=True)

    prov = FakeProvider(backend, calls(C("c1", "login")), say("never"))
    async with await kit(Gate("login")) as tk:
        t0 = time.monotonic()
        with pytest.raises(RunTimeout):
            await prov.client(timeout=0.05, wait_for=wait_for).run("go", tk)
    assert time.monotonic() - t0 < 0.4


@all_backends
async def test_a_cancel_event_set_before_the_run_raises_run_cancelled(backend):
    cancel = asyncio.Event()
    cancel.set()
    prov = FakeProvider(backend, say("never"))
    async with await kit(adder()) as tk:
        with pytest.raises(RunCancelled):
            await prov.client().run("go", tk, cancel=cancel)


@all_backends
async def test_a_cancel_event_set_during_a_tool_stops_the_run(backend):
    cancel = asyncio.Event()

    def stop(args, ctx):
        cancel.set()
        return ToolResult(output="stopping")

    tool = Tool(
        name="stop", description="s", input_schema={"type": "object"}, source="native", execute=stop
    )
    prov = FakeProvider(backend, calls(C("c1", "stop")), say("never"))
    async with await create_toolkit(builtins=False, extra_tools=[tool]) as tk:
        with pytest.raises(RunCancelled):
            await prov.client().run("go", tk, cancel=cancel)
    assert len(prov.bodies) == 1


async def test_cancel_applies_to_run_with_answer():
    cancel = asyncio.Event()
    prov = FakeProvider("openai", calls(C("c1", "login")), say("never"))
    async with await kit(Gate("login")) as tk:
        client = prov.client()
        r1 = await client.run("go", tk)
        cancel.set()
        with pytest.raises(RunCancelled):
            await client.run_with_answer(
                tk, r1.messages, r1.pending, Answer(id=r1.pending.id, ok=True), cancel=cancel
            )
    assert len(prov.bodies) == 1


def test_run_sync_twin_works_without_an_event_loop():
    tk = asyncio.run(create_toolkit(builtins=False, extra_tools=[adder().tool]))
    prov = FakeProvider("inprocess", calls(C("c1", "add", {"a": 1, "b": 2})), say("3"))
    r = prov.client().run_sync("go", tk)
    assert r.status == "done" and prov.results_seen() == {"c1": "3"}


@all_backends
async def test_a_cancel_event_set_while_a_tool_is_awaiting_raises_run_cancelled(backend):
    cancel = asyncio.Event()

    async def slow(args, ctx):
        asyncio.get_running_loop().call_later(0.02, cancel.set)
        await asyncio.sleep(0.4)
        return ToolResult(output="late")

    tool = Tool(
        name="slow", description="s", input_schema={"type": "object"}, source="native", execute=slow
    )
    prov = FakeProvider(backend, calls(C("c1", "slow")), say("never"))
    async with await create_toolkit(builtins=False, extra_tools=[tool]) as tk:
        t0 = time.monotonic()
        with pytest.raises(RunCancelled):
            await prov.client().run("go", tk, cancel=cancel)
    assert time.monotonic() - t0 < 0.35
    assert len(prov.bodies) == 1
