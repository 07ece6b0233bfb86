"""toolnexus.texts: every text the model reads that the engine writes, pinned word for word."""

from __future__ import annotations

import pytest

from tests.engine.helpers import Gate, kit
from toolnexus import Answer, Request, Tool, create_in_process_client, pending, texts
from toolnexus.builtins import question_prompt
from toolnexus.client import declined_text
from toolnexus.relay import answer_declined, decline_text, relay_prompt, relay_tool


def test_the_decline_texts_of_the_contract():
    assert texts.relay_declined("refund", "amount exceeds refund policy") == (
        "relay declined for refund: amount exceeds refund policy"
    )
    assert texts.declined("Allow x?", "not now") == "declined/expired: Allow x? (reason: not now)"


@pytest.mark.parametrize("reason", ["", None])
def test_a_refusal_never_reads_empty(reason):
    assert texts.relay_declined("refund", reason) == "relay declined for refund: declined"
    assert texts.declined("p", reason) == "declined/expired: p (reason: declined)"
    assert texts.not_approved("rm", reason) == "rm was not approved (reason: declined)"
    assert texts.question_not_answered(reason) == "question was not answered (reason: declined)"


def test_the_other_texts():
    assert texts.relay_prompt("refund") == "relay tool call refund to the caller for execution"
    assert texts.no_result_on_resume("refund") == "no result supplied on resume for refund"
    assert texts.unresolved("Allow x?") == "unresolved: Allow x?"
    assert texts.invalid_arguments("add", "boom") == "invalid arguments for add: boom"
    assert texts.unknown_tool("x") == "Unknown tool: x"
    assert texts.tool_failed("add", ValueError("bad")) == "tool add failed: ValueError: bad"
    assert texts.tool_returned("add", 3) == "tool add returned int, not a ToolResult"
    assert (
        texts.approval_prompt("rm", {"b": 1, "a": "é"})
        == 'Allow rm to run with {"a": "é", "b": 1}?'
    )
    assert texts.edited_arguments_invalid("rm", "x: required") == (
        "edited arguments for rm are invalid: x: required"
    )
    assert (
        texts.question_prompt(
            [{"question": "Which?", "options": ["a", {"label": "b"}]}, {"question": "Why?"}, 7]
        )
        == "Which? (options: a, b)\nWhy?"
    )


def test_the_old_import_places_are_the_same_functions():
    assert decline_text is texts.relay_declined
    assert relay_prompt is texts.relay_prompt
    assert question_prompt is texts.question_prompt
    request = Request(id="r", kind="approval", prompt="Allow x?")
    assert declined_text(request, "no") == texts.declined("Allow x?", "no")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("relay declined for refund: amount exceeds refund policy", "amount exceeds refund policy"),
        ("relay declined for refund: a: b (c)", "a: b (c)"),
        ("declined/expired: Allow x? (reason: not now)", "not now"),
        ("declined/expired: Allow (y)? (reason: a (b))", "a (b)"),
        ("unresolved: Allow x?", None),
        ("5", None),
    ],
)
def test_declined_reason_reads_either_decline_back(text, reason):
    assert texts.declined_reason(text) == reason
    assert texts.is_declined(text) is (reason is not None)


@pytest.mark.parametrize(
    "text", ["unresolved: p", "no result supplied on resume for x", "invalid arguments for x: y"]
)
def test_failure_prefixes(text):
    assert text.startswith(texts.FAILURE_PREFIXES)


# -- the loop, relay tools and the gate write these texts -----------------------------------


def _model(*turns):
    replies = iter(turns)
    seen: list[list[dict]] = []

    def generate(req):
        seen.append([m for m in req.messages if m["role"] == "tool"])
        return next(replies)

    return generate, seen


async def test_the_model_reads_these_texts_on_every_path_of_a_turn():
    gate = Gate("login", kind="approval", prompt="Allow login?")
    generate, seen = _model(
        {
            "tool_calls": [
                {"id": "c1", "name": "refund", "arguments": {}},
                {"id": "c2", "name": "login", "arguments": {}},
                {"id": "c3", "name": "nope", "arguments": {}},
                {"id": "c4", "name": "add", "arguments": "[1]"},
            ]
        },
        "done",
    )

    def wait_for(request):
        return answer_declined(request.id, "" if request.kind == "tool_call" else "later")

    client = create_in_process_client(generate=generate, wait_for=wait_for)
    async with await kit(relay_tool("refund", "r"), gate) as tk:
        await client.run("go", tk)
    assert [m["content"] for m in seen[-1]] == [
        texts.relay_declined("refund", None),
        texts.declined("Allow login?", "later"),
        texts.unknown_tool("nope"),
        texts.invalid_arguments("add", "arguments must be a JSON object, got list"),
    ]


async def test_a_retry_that_suspends_again_reads_unresolved():
    def always_pending(args, ctx):
        return pending(kind="input", prompt="Sign in")

    tool = Tool("login", "l", {"type": "object"}, execute=always_pending)
    generate, seen = _model({"tool_calls": [{"id": "c1", "name": "login"}]}, "ok")
    client = create_in_process_client(
        generate=generate, wait_for=lambda q: Answer(id=q.id, ok=True)
    )
    async with await kit(tool) as tk:
        await client.run("go", tk)
    assert seen[-1][0]["content"] == texts.unresolved("Sign in")
