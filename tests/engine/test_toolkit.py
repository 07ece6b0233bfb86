"""toolnexus.toolkit: `Toolkit.start`, the first step of `execute` the loop uses directly.

(The toolkit's contract items are in test_checklist_toolkit.py.)"""

from __future__ import annotations

import inspect

from toolnexus import Tool, ToolContext, Toolkit, ToolResult


def kit(execute) -> Toolkit:
    return Toolkit([Tool("t", "t", {"type": "object"}, execute=execute)])


async def test_start_returns_a_plain_tools_result_at_once():
    tk = kit(lambda args, ctx: ToolResult(f"got {args['x']}"))
    assert tk.start("t", {"x": 1}) == ToolResult("got 1")
    assert kit(lambda args, ctx: "text").start("t", {}) == ToolResult("text")
    assert kit(lambda args, ctx: 3).start("t", {}) == ToolResult(
        "tool t returned int, not a ToolResult", is_error=True
    )
    assert tk.start("nope", {}) == ToolResult("Unknown tool: nope", is_error=True)


async def test_start_returns_an_awaitable_for_an_async_tool():
    async def execute(args, ctx):
        return "later" if ctx.call_id == "c1" else 3

    tk = kit(execute)
    started = tk.start("t", {}, ToolContext(call_id="c1"))
    assert inspect.isawaitable(started)
    assert await started == ToolResult("later")
    assert (await tk.start("t", {})).is_error


async def test_execute_is_start_awaited():
    async def execute(args, ctx):
        return ToolResult("async")

    assert await kit(execute).execute("t", None) == ToolResult("async")
    assert await kit(lambda args, ctx: "plain").execute("t", None) == ToolResult("plain")
