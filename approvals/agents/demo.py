"""The built-in `demo` agent: a deterministic in-process model, so the whole flow works
offline on a fresh machine. It knows five flows, picked from the prompt's words:

- a refund (default): one relay call `refund`, run by a host executor once approved;
- "question" / "ask": the `question` builtin;
- "email" / "two" / "both": a refund and an email relayed in ONE model turn;
- "delete": an approval-gated `delete_account` tool;
- "book" and "table" ("Book a table for tonight"): `book_table`, the tool of a small MCP
  server shipped in this package (`demo_mcp_server`, over stdio), which asks the reviewer
  who the table is for (an MCP elicitation) before it books. Only these runs start the
  server (the `mcp` extra is needed for them alone).

After the tools answer, it replies by reading what the tools returned, declines included.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from toolnexus import (
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    Tool,
    ToolResult,
    create_in_process_client,
)
from toolnexus.approval import approval_required
from toolnexus.builtins import create_builtin_tools
from toolnexus.mcp import McpServer
from toolnexus.relay import relay_tool

from ..conf import app_settings
from .registry import register

REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "string", "description": "Order number"},
        "amount": {
            "type": "number",
            "minimum": 0,
            "maximum": 10000,
            "description": "Amount in USD",
        },
    },
    "required": ["order", "amount"],
    "additionalProperties": False,
}
EMAIL_SCHEMA = {
    "type": "object",
    "properties": {
        "to": {"type": "string"},
        "subject": {"type": "string"},
        "body": {"type": "string"},
    },
    "required": ["to", "subject", "body"],
    "additionalProperties": False,
}
DELETE_SCHEMA = {
    "type": "object",
    "properties": {"account": {"type": "string", "minLength": 1}},
    "required": ["account"],
    "additionalProperties": False,
}

SYSTEM_PROMPT = "You are a support agent. Refunds, emails and deletions need a human's approval."

DEMO_MCP_MODULE = "approvals.agents.demo_mcp_server"
# Where `python -m approvals...` finds the package, wherever the app is installed.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def tables_server(**options: Any) -> McpServer:
    """The demo's MCP server (`tables`: one tool, `book_table`), run over stdio with this
    interpreter; `options` go to `McpServer` (e.g. `env` for its log file in tests)."""
    return McpServer.stdio(
        "tables", sys.executable, "-m", DEMO_MCP_MODULE, cwd=_PACKAGE_ROOT, **options
    )


def wants_a_table(prompt: str) -> bool:
    words = set(re.findall(r"[a-z]+", prompt.lower()))
    return bool({"book", "booking", "reserve"} & words) and bool({"table", "tables"} & words)


def demo_mcp_servers(run: Any) -> list[McpServer]:
    """Only the demo runs that book a table start the MCP server (it costs a second)."""
    return [tables_server()] if wants_a_table(getattr(run, "prompt", "") or "") else []


def issue_refund(args: dict[str, Any]) -> str:
    """The demo's host executor for `refund`: pretend to call the payments system."""
    return f"refund issued: ${args['amount']} to order {args['order']}"


def _delete_account(args: dict[str, Any], ctx: Any) -> ToolResult:
    return ToolResult(f"account {args['account']} scheduled for deletion")


def demo_tools() -> list[Tool]:
    question = [t for t in create_builtin_tools() if t.name == "question"]
    return [
        relay_tool("refund", "Refund an order (runs after a human approves it).", REFUND_SCHEMA),
        relay_tool("send_email", "Send an email to a customer (a human sends it).", EMAIL_SCHEMA),
        approval_required(
            Tool(
                "delete_account",
                "Delete a customer account.",
                DELETE_SCHEMA,
                execute=_delete_account,
            ),
            prompt=lambda name, args: (
                f"Delete account {args.get('account', '?')}? This cannot be undone."
            ),
        ),
        *question,
    ]


def _first_user_text(messages: list[dict[str, Any]]) -> str:
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"]
    return ""


# An order id: "B-7", "ab-1234" (1-3 letters, a dash, digits) or a number.
_ORDER_ID = r"[A-Z]{1,3}-\d+"
# The order the prompt names, in any case: "order 42", "Order b-1", "ORDER #77", "order no. 5",
# "order number 9", "order id: A-3".
_ORDER_NAMED = re.compile(
    rf"\border\s*(?:no\.?|number|id)?\s*[#:]?\s*({_ORDER_ID}|\d+)\b", re.IGNORECASE
)


def order_of(prompt: str) -> str:
    """The order a prompt is about: the one named "order <id>" wins, else the first
    letter-dash id ("B-7"), else a bare number of 4+ digits, else the demo's own A-1001.
    The id is kept as the prompt spells it."""
    order = (
        _ORDER_NAMED.search(prompt)
        or re.search(rf"\b({_ORDER_ID})\b", prompt, re.IGNORECASE)
        or re.search(r"#?(\d{4,})", prompt)
    )
    return order.group(1) if order else "A-1001"


def _plan(prompt: str) -> list[InProcessToolCall]:
    words = prompt.lower()
    order_id = order_of(prompt)
    amount_match = re.search(r"\$\s*(\d+(?:\.\d+)?)", prompt) or re.search(
        r"\b(\d{1,4}(?:\.\d+)?)\s*(?:usd|dollars?)\b", words
    )
    amount = float(amount_match.group(1)) if amount_match else 250
    amount = int(amount) if amount == int(amount) else amount
    refund = InProcessToolCall("call_refund", "refund", {"order": order_id, "amount": amount})
    if wants_a_table(prompt):
        at = re.search(r"\b(\d{1,2}[:.]\d{2}|\d{1,2}\s*(?:am|pm))\b", words)
        args = {"restaurant": "Trattoria Demo", "time": at.group(1) if at else "19:30"}
        return [InProcessToolCall("call_book", "book_table", args)]
    if "question" in words or "ask" in words:
        questions = [
            {
                "question": "Which plan should the customer move to?",
                "header": "Plan",
                "options": [{"label": "basic"}, {"label": "pro"}],
            }
        ]
        return [InProcessToolCall("call_question", "question", {"questions": questions})]
    if "delete" in words:
        # The account named after the word "account" (the model's choice, so the approval's
        # prompt carries text the user typed), else acct-42.
        named = re.search(r"\baccount\s+(<[^>]*>|\S+)", prompt, re.IGNORECASE)
        account = named.group(1).rstrip(".,;:!?")[:200] if named else ""
        account = account if account and account.lower() not in ("for", "of", "the") else "acct-42"
        return [InProcessToolCall("call_delete", "delete_account", {"account": account})]
    if "email" in words or "two" in words or "both" in words:
        email = {
            "to": "customer@example.com",
            "subject": f"Your refund for {order_id}",
            "body": f"We are refunding ${amount}.",
        }
        return [refund, InProcessToolCall("call_email", "send_email", email)]
    return [refund]


def _describe(name: str, output: str) -> str:
    if name == "book_table":
        # The MCP server's own result, after the engine's note of a refusal if there was one.
        said = output.splitlines()[-1] if output else "no answer"
        if output.startswith("declined/expired:"):
            return f"The booking service was not given the details. It answered: {said}"
        return f"The booking service answered: {said}"
    if output.startswith("relay declined for") or output.startswith("declined/expired:"):
        reason = re.search(r"(?:reason: |: )([^()]*?)\)?$", output)
        why = reason.group(1) if reason else "declined"
        return f"I did not run {name}: the reviewer declined it ({why}). I can offer store credit or escalate to a manager instead."
    if output.startswith(
        ("unresolved:", "no result supplied", "invalid arguments", "edited arguments")
    ):
        return f"{name} did not go through: {output}"
    if name == "question":
        try:
            answer = json.loads(output)
        except ValueError:
            answer = output
        answers = answer.get("answers") if isinstance(answer, dict) else None
        if isinstance(answers, dict) and answers:
            said = "; ".join(f"{q} {a}" for q, a in answers.items())
            return f"Thanks, noted your answer: {said}."
        return f"Thanks, noted the answer: {json.dumps(answer, ensure_ascii=False)}."
    return f"Done with {name}: {output}."


def demo_generate(request: InProcessRequest) -> InProcessResponse:
    messages = request.messages
    last_assistant = max(
        (i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1
    )
    last = messages[-1] if messages else {}
    follow_up = (
        last_assistant >= 0 and last.get("role") == "user" and isinstance(last.get("content"), str)
    )
    if last_assistant < 0 or follow_up:
        # A new request: the prompt, or a follow-up on a finished run (its newest message).
        return InProcessResponse(
            content="Let me take care of that.",
            tool_calls=_plan(last["content"] if follow_up else _first_user_text(messages)),
            usage={"prompt_tokens": 40, "completion_tokens": 12},
        )
    names = {
        tc["id"]: tc["function"]["name"] for tc in messages[last_assistant].get("tool_calls") or []
    }
    results = [m for m in messages[last_assistant + 1 :] if m.get("role") == "tool"]
    lines = [
        _describe(names.get(m["tool_call_id"], "the tool"), m.get("content") or "") for m in results
    ]
    return InProcessResponse(
        content=" ".join(lines) or "All done.", usage={"prompt_tokens": 60, "completion_tokens": 30}
    )


def register_demo_agent() -> None:
    register(
        "demo",
        model=lambda: create_in_process_client(
            generate=demo_generate,
            model="demo-in-process",
            # A streamed reply arrives word by word, as a real model's would.
            word_delay=float(app_settings.DEMO_WORD_SECONDS or 0),
        ),
        tools=demo_tools,
        executors={"refund": issue_refund},
        system_prompt=SYSTEM_PROMPT,
        description=(
            "Offline demo: refunds, a question, a two-call turn, an approval-gated deletion,"
            " and a table booking whose MCP server asks who it is for."
        ),
        mcp_servers=demo_mcp_servers,
    )
