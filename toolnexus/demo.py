"""Offline terminal demo of the suspension flow: halt, a human decides, resume, the reply.

    python -m toolnexus.demo                 # asks you to approve or decline (scripted when not a TTY)
    python -m toolnexus.demo --decline "amount exceeds refund policy"
    python -m toolnexus.demo --approve

The model is a deterministic in-process function, so this needs no network and no key.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from . import (
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    create_in_process_client,
    create_toolkit,
)
from .relay import answer_declined, answer_output, relay_calls_of, relay_tool
from .texts import declined_reason
from .types import Request

REFUND_SCHEMA = {
    "type": "object",
    "properties": {"order": {"type": "string"}, "amount": {"type": "number", "minimum": 0}},
    "required": ["order", "amount"],
}


def demo_model(request: InProcessRequest) -> InProcessResponse:
    """Asks for a refund, then reads the tool result and answers the way a model would."""
    results = [m for m in request.messages if m.get("role") == "tool"]
    if not results:
        return InProcessResponse(
            content="Let me refund order A-1001.",
            tool_calls=[
                InProcessToolCall(
                    id="call_refund_1", name="refund", arguments={"order": "A-1001", "amount": 250}
                )
            ],
            usage={"prompt_tokens": 12, "completion_tokens": 9},
        )
    last = results[-1]["content"]
    reason = declined_reason(last)
    if reason is not None:
        text = f"Understood: I did not issue the refund, because the reviewer declined it ({reason}). I can escalate to a manager or offer store credit instead."
    else:
        text = f"Done: the refund went through ({last})."
    return InProcessResponse(content=text, usage={"prompt_tokens": 20, "completion_tokens": 24})


def _decide(args: argparse.Namespace, calls: list[Any]) -> tuple[str, str]:
    if args.approve:
        return "approve", ""
    if args.decline is not None:
        return "decline", args.decline
    if not sys.stdin.isatty():
        return "decline", "amount exceeds refund policy"
    choice = input("Approve or decline? [a/d] ").strip().lower()
    if choice.startswith("a"):
        return "approve", ""
    return "decline", input("Reason (empty means 'declined'): ").strip()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--approve", action="store_true", help="approve the refund")
    group.add_argument("--decline", metavar="REASON", help="decline with this reason")
    args = parser.parse_args(argv)

    toolkit = await create_toolkit(
        builtins=False, extra_tools=[relay_tool("refund", "Issue a refund", REFUND_SCHEMA)]
    )
    client = create_in_process_client(generate=demo_model, model="demo")
    prompt = "Customer on order A-1001 wants their $250 back."
    print(f"user      > {prompt}")
    halted = await client.run(prompt, toolkit)
    request = halted.pending
    assert request is not None
    print(f"status    : {halted.status} (the run is halted; nothing is held in memory)")
    print(f"request   : {request.to_json()}")
    calls = relay_calls_of(request)
    for call in calls:
        print(f"call      : {call.name} {json.dumps(call.input)}")

    # A real host stores these three plain-JSON values and resumes in any process, any time later.
    stored = json.dumps({"messages": halted.messages, "pending": request.to_dict()})

    decision, reason = _decide(args, calls)
    if decision == "approve":
        answer = answer_output(request.id, "refund R-77 issued for $250")
    else:
        answer = answer_declined(request.id, reason)
    print(f"decision  : {decision}{' (reason: ' + answer.reason + ')' if not answer.ok else ''}")
    print(f"answer    : {answer.to_json()}")

    saved = json.loads(stored)
    resumed = await client.run_with_answer(
        toolkit, saved["messages"], Request.from_dict(saved["pending"]), answer
    )
    tool_message = next(m for m in reversed(resumed.messages) if m.get("role") == "tool")
    print(f"model saw : {tool_message['content']}")
    print(f"assistant > {resumed.text}")
    print(f"status    : {resumed.status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
