"""`on_text`: the reply's text as the model generates it, in `run`, `run_with_answer` and
`continue_run` (a host shows it live; the transcript keeps the whole turn)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.engine.helpers import (
    BASE_URL,
    HTTP_STYLES,
    MODEL,
    C,
    FakeProvider,
    calls,
    kit,
    say,
)
from toolnexus import Answer, create_client, create_in_process_client
from toolnexus.relay import relay_tool

http_styles = pytest.mark.parametrize("style", HTTP_STYLES)
REFUND = {"type": "object", "properties": {"amount": {"type": "integer"}}}


@http_styles
async def test_run_asks_for_a_stream_and_reports_each_piece(style):
    prov = FakeProvider(style, say("Refunds take three days."))
    pieces: list[str] = []
    async with await kit() as tk:
        result = await prov.client(on_text=pieces.append).run("refund?", tk)
    assert prov.last["stream"] is True
    # FakeProvider's SSE sends the text in two events: two pieces, in order.
    assert pieces == ["Refunds take", " three days."]
    assert result.status == "done" and result.text == "Refunds take three days."
    assert prov.requests and result.messages[-1]["role"] == "assistant"


@http_styles
async def test_without_on_text_the_body_asks_for_no_stream(style):
    prov = FakeProvider(style, say("plain"))
    async with await kit() as tk:
        result = await prov.client().run("hi", tk)
    assert "stream" not in prov.last
    assert result.text == "plain"


@http_styles
async def test_declined_call_the_model_reads_the_reason_and_answers_in_pieces(style):
    """The app's case: a relay call declined with a reason; the resumed turn streams."""
    prov = FakeProvider(
        style,
        calls(C("c1", "refund", {"amount": 250}), text="Let me refund."),
        say("I could not refund: over the policy limit."),
    )
    pieces: list[str] = []
    async with await kit(relay_tool("refund", "Refund", REFUND)) as tk:
        client = prov.client(on_text=pieces.append)
        halted = await client.run("refund 250", tk)
        assert halted.status == "pending"
        assert pieces == ["Let me ", "refund."]
        pieces.clear()
        answer = Answer(id=halted.pending.id, ok=False, reason="over the policy limit")
        done = await client.run_with_answer(tk, halted.messages, halted.pending, answer)
    assert "over the policy limit" in json.dumps(prov.bodies[-1]["messages"])
    assert len(pieces) == 2 and "".join(pieces) == "I could not refund: over the policy limit."
    assert done.status == "done" and done.text == "".join(pieces)


@http_styles
async def test_continue_run_reports_text_too(style):
    prov = FakeProvider(style, say("carried on"))
    pieces: list[str] = []
    async with await kit() as tk:
        client = prov.client(on_text=pieces.append)
        start = client.dialect.start_messages("", None, "go on")
        result = await client.continue_run(tk, start)
    assert "".join(pieces) == "carried on" and result.text == "carried on"


def _openai_chunk(text: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


def _anthropic_chunk(text: str) -> bytes:
    event = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }
    return f"event: content_block_delta\ndata: {json.dumps(event)}\n\n".encode()


@http_styles
async def test_a_piece_is_reported_before_the_rest_of_the_stream_is_sent(style):
    """Pieces are reported as they arrive, not once the reply is complete: the endpoint
    sends its second piece only after the first was reported."""
    first_seen = asyncio.Event()
    pieces: list[str] = []

    def on_text(piece: str) -> None:
        pieces.append(piece)
        first_seen.set()

    async def body():
        if style == "openai":
            yield _openai_chunk("Hello")
            await asyncio.wait_for(first_seen.wait(), 5)
            yield _openai_chunk(" world")
            yield b"data: [DONE]\n\n"
        else:
            start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
            yield f"data: {json.dumps(start)}\n\n".encode()
            yield _anthropic_chunk("Hello")
            await asyncio.wait_for(first_seen.wait(), 5)
            yield _anthropic_chunk(" world")
            yield b'data: {"type": "message_stop"}\n\n'

    def handle(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    client = create_client(
        base_url=BASE_URL, style=style, model=MODEL, api_key="k", http_client=http, on_text=on_text
    )
    async with await kit() as tk:
        result = await client.run("hi", tk)
    assert pieces == ["Hello", " world"]
    assert result.text == "Hello world"
    await http.aclose()


async def test_in_process_word_delay_reports_word_by_word():
    pieces: list[str] = []
    client = create_in_process_client(
        generate=lambda req: "Not  refunded: over\nthe limit. ",
        word_delay=0.001,
        on_text=pieces.append,
    )
    async with await kit() as tk:
        result = await client.run("hi", tk)
    assert pieces == ["Not", "  refunded:", " over", "\nthe", " limit.", " "]
    assert "".join(pieces) == result.text == "Not  refunded: over\nthe limit. "


async def test_in_process_without_delay_reports_the_text_whole():
    pieces: list[str] = []
    client = create_in_process_client(generate=lambda req: "all at once", on_text=pieces.append)
    async with await kit() as tk:
        await client.run("hi", tk)
    assert pieces == ["all at once"]


async def test_in_process_word_delay_is_not_paid_without_a_listener():
    client = create_in_process_client(generate=lambda req: "one two three", word_delay=5.0)
    async with await kit() as tk:
        result = await asyncio.wait_for(client.run("hi", tk), 2)
    assert result.text == "one two three"


@http_styles
async def test_an_endpoint_that_does_not_stream_still_gives_the_whole_turn(style):
    """Asked for a stream, an endpoint that answers plain JSON (some proxies and local
    servers do): the turn is parsed as a reply, its text reported at once."""
    plain = FakeProvider(style, calls(C("c1", "refund", {"amount": 5}), text="Checking."))

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["stream"] is True
        body.pop("stream")
        return plain.handle(httpx.Request("POST", request.url, json=body))

    http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    pieces: list[str] = []
    client = create_client(
        base_url=BASE_URL,
        style=style,
        model=MODEL,
        api_key="k",
        http_client=http,
        on_text=pieces.append,
    )
    async with await kit(relay_tool("refund", "Refund", REFUND)) as tk:
        result = await client.run("refund 5", tk)
    assert pieces == ["Checking."]
    assert result.status == "pending" and result.pending is not None
    await http.aclose()
