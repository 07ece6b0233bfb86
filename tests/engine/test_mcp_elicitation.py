"""MCP elicitation: a server's question halts the run durably, and the answer reaches it.

Against the real demo server (`mcp_servers/demo_server.py`), whose log tells what each of
its questions was answered. A halt is resumed with a FRESH toolkit (a new server process)
and a FRESH client, from JSON only - what a worker restart leaves.
"""

from __future__ import annotations

import json

import pytest

from tests.engine.helpers import C, FakeProvider, assert_balanced, calls, collect, say, types_of
from tests.engine.mcp_servers.harness import (
    PYTHON,
    answers,
    demo,
    events,
    http_server,
    no_leaked_servers,  # noqa: F401  (an autouse fixture)
    server_pids,
)
from toolnexus import Answer, Request, create_toolkit
from toolnexus.mcp import (
    McpServer,
    answer_elicitation,
    answer_to_elicit_result,
    elicit_action,
    elicitation_errors,
)
from toolnexus.relay import answer_declined


@pytest.fixture
def log(tmp_path):
    return tmp_path / "demo.jsonl"


def stored(result):
    """What a host stores at a halt, read back: plain JSON (a worker restart in between)."""
    return (
        json.loads(json.dumps(result.messages)),
        Request.from_dict(json.loads(result.pending.to_json())),
    )


async def halt(log, tool="ask_name", args=None, **options):
    """Run until the server's question halts the run; the toolkit is closed afterwards."""
    provider = FakeProvider("inprocess", calls(C("c1", tool, args or {})), default=say("ok"))
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log, **options)]) as tk:
        result = await provider.client().run("go", tk)
    assert result.status == "pending", result
    return result


async def resume(log, halted, answer, *, reply="done", **options):
    """Resume from stored JSON with a new toolkit, a new server process and a new client."""
    messages, request = stored(halted)
    provider = FakeProvider("inprocess", say(reply))
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log, **options)]) as tk:
        result = await provider.client().run_with_answer(tk, messages, request, answer)
    return result, provider


# -- the halt ----------------------------------------------------------------------------------


async def test_a_question_during_a_call_halts_the_run_with_an_elicitation_request(log):
    halted = await halt(log, args={"greeting": "Hi"})
    request = halted.pending
    assert request.kind == "elicitation"
    assert request.prompt == "What is your name?" == halted.text
    assert request.url is None
    data = request.data
    assert data["server"] == "demo" and data["tool"] == "ask_name"
    assert data["mode"] == "form" and data["input"] == {"greeting": "Hi"}
    assert data["callId"] == "c1"
    assert data["schema"]["properties"]["name"]["type"] == "string"
    assert data["schema"]["required"] == ["name"]
    # the halt is a placeholder result, never a tool error the model acts on
    assert halted.tool_calls[0]["output"] == "What is your name?"
    # the server's call was cancelled, nothing was answered
    assert [e["event"] for e in events(log) if e["event"] != "start"] == ["call", "cancelled"]
    # the request is plain wire JSON, as every other kind
    assert Request.from_dict(json.loads(request.to_json())) == request


async def test_accept_after_a_restart_gives_the_server_the_stored_answer(log):
    halted = await halt(log, args={"greeting": "Hi"})
    first_pid = server_pids(log)[0]
    answer = Answer(id=halted.pending.id, ok=True, data={"name": "Ada"})
    result, provider = await resume(log, halted, answer, reply="Greeted Ada.")
    assert result.status == "done" and result.text == "Greeted Ada."
    assert provider.results_seen() == {"c1": "Hi, Ada!"}
    assert answers(log) == [("accept", {"name": "Ada"})]
    second_pid = server_pids(log)[1]
    assert second_pid != first_pid  # answered by a server process that never saw the halt
    assert_balanced(result.messages, "openai")


async def test_decline_and_expiry_reach_the_model_with_the_reason(log):
    halted = await halt(log)
    result, provider = await resume(log, halted, answer_declined(halted.pending.id))
    assert result.status == "done"
    assert provider.results_seen()["c1"].startswith(
        "declined/expired: What is your name? (reason: declined)"
    )
    halted = await halt(log)
    result, provider = await resume(log, halted, answer_declined(halted.pending.id, "expired"))
    assert provider.results_seen()["c1"].startswith(
        "declined/expired: What is your name? (reason: expired)"
    )


@pytest.mark.parametrize(("reason", "action"), [("declined", "decline"), ("expired", "cancel")])
async def test_a_durable_refusal_reaches_the_server(log, reason, action):
    halted = await halt(log)
    result, provider = await resume(log, halted, answer_declined(halted.pending.id, reason))
    assert result.status == "done"
    assert answers(log) == [(action, None)]
    assert provider.results_seen()["c1"] == (
        f"declined/expired: What is your name? (reason: {reason})\nno name given ({action})"
    )


async def test_a_resume_whose_server_does_not_start_reads_an_error_and_finishes(log):
    halted = await halt(log)
    messages, request = stored(halted)
    down = McpServer.stdio(
        "demo", PYTHON, "-c", "import sys; sys.exit('disk quota exceeded')", required=False
    )
    provider = FakeProvider("inprocess", say("the name service is down"))
    with pytest.warns(UserWarning, match='MCP server "demo" failed to start'):
        tk = await create_toolkit(builtins=False, mcp_servers=[down])
    async with tk:
        result = await provider.client().run_with_answer(
            tk, messages, request, Answer(id=request.id, ok=True, data={"name": "Ada"})
        )
    assert result.status == "done" and result.text == "the name service is down"
    seen = provider.results_seen()["c1"]
    assert seen.startswith('ask_name was not run: MCP server "demo" is unavailable')
    assert "disk quota exceeded" in seen
    assert result.tool_calls[0]["is_error"] is True
    assert answers(log) == []


@pytest.mark.parametrize(
    ("reason", "action"), [("cancelled", "cancel"), ("expired", "cancel"), ("declined", "decline")]
)
async def test_answer_elicitation_tells_the_server_outside_any_run(log, reason, action):
    """A run that will not resume (cancelled): the server hears how its question ended."""
    halted = await halt(log, args={"greeting": "Hi"})
    _, request = stored(halted)
    result = await answer_elicitation([demo(log)], request, answer_declined(request.id, reason))
    assert answers(log) == [(action, None)]
    assert result.is_error  # a refusal, as the model would have read it
    assert result.output == (
        f"declined/expired: What is your name? (reason: {reason})\nno name given ({action})"
    )
    assert len(server_pids(log)) == 2  # a server of its own, stopped since


async def test_answer_elicitation_with_a_server_that_does_not_start_is_an_error(log):
    halted = await halt(log)
    _, request = stored(halted)
    down = McpServer.stdio("demo", PYTHON, "-c", "import sys; sys.exit('gone for good')")
    result = await answer_elicitation([down], request, answer_declined(request.id, "cancelled"))
    assert result.is_error
    assert result.output.startswith('ask_name was not run: MCP server "demo" failed to start')
    assert "gone for good" in result.output
    result = await answer_elicitation([], request, answer_declined(request.id, "cancelled"))
    assert result.output == (
        'ask_name was not run: MCP server "demo" is not among the servers given'
    )
    with pytest.raises(ValueError, match="does not echo"):
        await answer_elicitation([down], request, answer_declined("elc-other", "cancelled"))


async def test_an_answer_that_does_not_fit_the_form_is_an_error_not_sent(log):
    halted = await halt(log)
    answer = Answer(id=halted.pending.id, ok=True, data={"name": 42})
    assert elicitation_errors(halted.pending, answer.data) == [
        "$.name: expected string, got integer"
    ]
    result, provider = await resume(log, halted, answer)
    seen = provider.results_seen()["c1"]
    assert 'The answer to the question of MCP server "demo" does not fit its form' in seen
    assert "$.name: expected string, got integer" in seen
    assert answers(log) == []  # the server was never given the bad content
    assert result.status == "done"


async def test_a_different_question_on_resume_is_not_given_the_old_answer(log):
    halted = await halt(log, tool="ask_colour")
    answer = Answer(id=halted.pending.id, ok=True, data={"colour": "red"})
    result, provider = await resume(log, halted, answer)
    seen = provider.results_seen()["c1"]
    assert 'MCP server "demo" asked another question when ask_colour was resumed' in seen
    assert "Call the tool again" in seen
    assert answers(log) == []
    assert result.status == "done"


async def test_a_follow_up_question_after_the_replayed_one_cancels_the_call(log):
    halted = await halt(log, tool="ask_twice")
    assert halted.pending.prompt == "What is your name?"
    answer = Answer(id=halted.pending.id, ok=True, data={"name": "Ada"})
    result, provider = await resume(log, halted, answer)
    assert result.status == "done"
    assert answers(log) == [("accept", {"name": "Ada"})]  # the first question was replayed
    assert "asked another question" in provider.results_seen()["c1"]
    assert '("How old are you?")' in provider.results_seen()["c1"]


async def test_an_answer_from_a_call_with_other_arguments_is_never_replayed(log):
    halted = await halt(log, args={"greeting": "Hi"})
    messages, request = stored(halted)
    # the transcript is tampered with: the halted call now carries other arguments
    messages[1]["tool_calls"][0]["function"]["arguments"] = '{"greeting": "Bye"}'
    provider = FakeProvider("inprocess", say("done"))
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log)]) as tk:
        await provider.client().run_with_answer(
            tk, messages, request, Answer(id=request.id, ok=True, data={"name": "Ada"})
        )
    assert "ask_name was not run: the answer was given" in provider.results_seen()["c1"]
    assert len([e for e in events(log, "call")]) == 1  # only the halted call


async def test_a_finished_call_of_the_halted_turn_is_not_run_again(log):
    provider = FakeProvider(
        "inprocess", calls(C("c1", "echo", {"text": "once"}), C("c2", "ask_name")), say("ok")
    )
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log)]) as tk:
        halted = await provider.client().run("go", tk)
    assert halted.pending.data["callId"] == "c2"
    result, provider = await resume(
        log, halted, Answer(id=halted.pending.id, ok=True, data={"name": "Ada"})
    )
    assert result.status == "done"
    assert provider.results_seen() == {"c1": "once", "c2": "Hello, Ada!"}
    assert len([e for e in events(log, "call") if e["tool"] == "echo"]) == 1


async def test_url_mode_halts_with_the_link_and_accept_is_consent(log):
    halted = await halt(log, tool="login")
    request = halted.pending
    assert request.kind == "elicitation" and request.url == "https://auth.example/login"
    assert request.data["mode"] == "url" and "schema" not in request.data
    # the server mints a new elicitation id each time it asks: the question still matches
    result, provider = await resume(log, halted, Answer(id=request.id, ok=True))
    assert result.status == "done"
    assert answers(log) == [("accept", None)]
    assert provider.results_seen()["c1"] == "login accept"


async def test_a_2026_server_asking_through_input_required_halts_the_same_way(log):
    halted = await halt(log, tool="archive", args={"item": "q3.pdf"}, protocol="auto")
    request = halted.pending
    assert request.kind == "elicitation" and request.prompt == "Really archive q3.pdf?"
    assert request.data["schema"]["properties"]["confirm"]["type"] == "boolean"
    answer = Answer(id=request.id, ok=True, data={"confirm": True})
    result, provider = await resume(log, halted, answer, protocol="auto")
    assert result.status == "done"
    assert provider.results_seen()["c1"] == "archived q3.pdf"
    assert answers(log) == [("accept", {"confirm": True})]


async def test_an_elicitation_over_streamable_http_halts_and_resumes(log):
    with http_server("http", log) as base:
        spec = McpServer.http("web", f"{base}/mcp")
        provider = FakeProvider("inprocess", calls(C("c1", "ask_name")), say("done"))
        async with await create_toolkit(builtins=False, mcp_servers=[spec]) as tk:
            client = provider.client()
            halted = await client.run("go", tk)
            assert halted.pending.kind == "elicitation" and halted.pending.data["server"] == "web"
            messages, request = stored(halted)
            result = await client.run_with_answer(
                tk, messages, request, Answer(id=request.id, ok=True, data={"name": "Lin"})
            )
    assert result.status == "done"
    assert provider.results_seen()["c1"] == "Hello, Lin!"
    assert answers(log) == [("accept", {"name": "Lin"})]


async def test_streaming_a_run_emits_the_elicitation_as_a_pending_event(log):
    provider = FakeProvider("inprocess", calls(C("c1", "ask_name")))
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log)]) as tk:
        evs = await collect(provider.client().stream("go", tk))
    assert types_of(evs)[-3:] == ["pending", "usage", "done"]
    pending_ev = next(e for e in evs if e["type"] == "pending")
    assert pending_ev["request"].kind == "elicitation"


async def test_an_approval_gated_tool_whose_server_then_asks(log):
    """One call suspends once: after the approval, the server's question cannot halt that
    call again, so the model reads `unresolved: <question>` (answer it inline instead)."""
    spec = {"approval": ["ask_*"]}
    provider = FakeProvider("inprocess", calls(C("c1", "ask_name")), say("done"))
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log, **spec)]) as tk:
        client = provider.client()
        halted = await client.run("go", tk)
        assert halted.pending.kind == "approval"
        result = await client.run_with_answer(
            tk, halted.messages, halted.pending, Answer(id=halted.pending.id, ok=True)
        )
    assert result.status == "done"
    assert provider.results_seen()["c1"] == "unresolved: What is your name?"
    assert [e["event"] for e in events(log) if e["event"] != "start"] == ["call", "cancelled"]

    def wait_for(request):
        return Answer(id=request.id, ok=True, data={"name": "Ada"})

    provider = FakeProvider("inprocess", calls(C("c1", "ask_name")), say("done"))
    async with await create_toolkit(
        builtins=False, mcp_servers=[demo(log, **spec)], wait_for=wait_for
    ) as tk:
        client = provider.client()
        halted = await client.run("go", tk)
        await client.run_with_answer(
            tk, halted.messages, halted.pending, Answer(id=halted.pending.id, ok=True)
        )
    assert provider.results_seen()["c1"] == "Hello, Ada!"


# -- answered inline: the toolkit's wait_for ---------------------------------------------------


@pytest.mark.parametrize(
    ("make", "action", "content", "seen"),
    [
        (
            lambda r: Answer(id=r.id, ok=True, data={"name": "Ada"}),
            "accept",
            {"name": "Ada"},
            "Hello, Ada!",
        ),
        (
            lambda r: answer_declined(r.id),
            "decline",
            None,
            "declined/expired: What is your name? (reason: declined)\nno name given (decline)",
        ),
        (
            lambda r: answer_declined(r.id, "expired"),
            "cancel",
            None,
            "declined/expired: What is your name? (reason: expired)\nno name given (cancel)",
        ),
        (
            lambda r: None,
            "cancel",
            None,
            "declined/expired: What is your name? (reason: cancelled)\nno name given (cancel)",
        ),
    ],
    ids=["accept", "decline", "expired", "no-answer"],
)
async def test_an_inline_wait_for_answers_during_the_call(log, make, action, content, seen):
    asked: list[Request] = []

    async def wait_for(request):
        asked.append(request)
        return make(request)

    provider = FakeProvider("inprocess", calls(C("c1", "ask_name")), say("done"))
    async with await create_toolkit(
        builtins=False, mcp_servers=[demo(log)], wait_for=wait_for
    ) as tk:
        result = await provider.client().run("go", tk)
    assert result.status == "done"  # never halted
    assert [r.kind for r in asked] == ["elicitation"]
    assert answers(log) == [(action, content)]
    assert provider.results_seen()["c1"] == seen


async def test_an_inline_wait_for_answers_a_follow_up_question_too(log):
    replies = iter([{"name": "Ada"}, {"age": 36}])

    def wait_for(request):
        return Answer(id=request.id, ok=True, data=next(replies))

    async with await create_toolkit(
        builtins=False, mcp_servers=[demo(log)], wait_for=wait_for
    ) as tk:
        result = await tk.execute("ask_twice", {})
    assert result.output == "accept/accept"
    assert answers(log) == [("accept", {"name": "Ada"}), ("accept", {"age": 36})]


async def test_time_waiting_for_a_human_inline_does_not_count_against_the_call_timeout(log):
    import asyncio

    async def slow_human(request):
        await asyncio.sleep(1.5)
        return Answer(id=request.id, ok=True, data={"name": "Ada"})

    async with await create_toolkit(
        builtins=False, mcp_servers=[demo(log, call_timeout=1)], wait_for=slow_human
    ) as tk:
        result = await tk.execute("ask_name", {})
    assert result.output == "Hello, Ada!"


# -- the bridge --------------------------------------------------------------------------------


def test_answer_to_elicit_result_returns_the_sdks_type():
    from mcp.types import ElicitResult

    accepted = answer_to_elicit_result(Answer(id="r", ok=True, data={"name": "Ada"}))
    assert isinstance(accepted, ElicitResult)
    assert accepted.model_dump(exclude_none=True) == {
        "action": "accept",
        "content": {"name": "Ada"},
    }
    assert answer_to_elicit_result(answer_declined("r")).action == "decline"
    assert answer_to_elicit_result(answer_declined("r", "expired")).action == "cancel"


@pytest.mark.parametrize(
    ("answer", "action"),
    [
        (Answer(id="r", ok=True, data={"name": "Ada"}), "accept"),
        (answer_declined("r"), "decline"),
        (answer_declined("r", "cancelled"), "cancel"),
        (answer_declined("r", "expired"), "cancel"),
        (answer_declined("r", "not a real guest"), "cancel"),
    ],
)
def test_elicit_action_names_what_the_server_hears_without_the_sdk(answer, action):
    """The one rule a host records by (`elicit_action`) is the one the SDK result follows."""
    assert elicit_action(answer) == action
    assert answer_to_elicit_result(answer).action == action


def test_the_connection_code_does_not_import_the_public_mcp_module():
    """`toolnexus.mcp` imports `toolnexus.mcp_client` (lazily); the reverse would be a cycle
    (the acyclic contract in pyproject.toml checks every engine module)."""
    import ast
    import inspect

    from toolnexus import mcp_client

    tree = ast.parse(inspect.getsource(mcp_client))
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }
    assert "mcp" not in imported and "mcp_spec" in imported


def test_elicitation_errors_name_each_field():
    request = Request(
        id="elc-1",
        kind="elicitation",
        data={
            "schema": {
                "type": "object",
                "properties": {"age": {"type": "integer", "minimum": 0}},
                "required": ["age"],
            }
        },
    )
    assert elicitation_errors(request, {"age": 3}) == []
    assert elicitation_errors(request, {}) == ["$.age: is required"]
    assert elicitation_errors(request, {"age": -1}) == ["$.age: must be at least 0"]
    assert elicitation_errors(request, {"age": 3, "tags": {"a": 1}}) == [
        "$.tags: must be a string, number, boolean, null or a list of strings"
    ]
