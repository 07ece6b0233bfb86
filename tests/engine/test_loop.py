"""toolnexus.loop: the run driver, on what the contract checklists do not pin.

How a turn's calls run (plain tools in the run's own task, async tools together), that the
loop talks to any model backend, and that a toolkit's own `execute` is honoured.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

from tests.engine.helpers import C, FakeProvider, calls, kit, say
from toolnexus import Client, Tool, ToolResult, create_toolkit
from toolnexus.dialects import OPENAI
from toolnexus.toolkit import Toolkit


def tool(name: str, execute: Any) -> Tool:
    return Tool(name, f"the {name} tool", {"type": "object"}, execute=execute)


async def test_plain_tools_run_in_the_runs_own_task_in_call_order():
    ran: list[tuple[str, asyncio.Task | None]] = []

    def plain(name):
        def execute(args, ctx):
            ran.append((name, asyncio.current_task()))
            return ToolResult(name)

        return execute

    prov = FakeProvider("openai", calls(C("c1", "a"), C("c2", "b"), C("c3", "a")), say("ok"))
    async with await kit(tool("a", plain("a")), tool("b", plain("b"))) as tk:
        run = asyncio.ensure_future(prov.client().run("go", tk))
        result = await run
    assert [name for name, _ in ran] == ["a", "b", "a"]
    assert {task for _, task in ran} == {run}  # no task per call
    assert [r["output"] for r in result.tool_calls] == ["a", "b", "a"]


async def test_async_tools_of_a_turn_still_run_together_and_land_in_call_order():
    started: list[str] = []

    def slow(name, delay):
        async def execute(args, ctx):
            started.append(name)
            await asyncio.sleep(delay)
            return ToolResult(name)

        return execute

    def plain(args, ctx):
        started.append("plain")
        return ToolResult("plain")

    prov = FakeProvider(
        "openai", calls(C("c1", "slow1"), C("c2", "plain"), C("c3", "slow2")), say("ok")
    )
    async with await kit(
        tool("slow1", slow("slow1", 0.15)), tool("plain", plain), tool("slow2", slow("slow2", 0.05))
    ) as tk:
        t0 = time.monotonic()
        await prov.client().run("go", tk)
        elapsed = time.monotonic() - t0
    assert elapsed < 0.19  # together, not one after the other (0.2 s)
    assert started == ["plain", "slow1", "slow2"]  # plain at once, async ones then start
    assert prov.results_seen() == {"c1": "slow1", "c2": "plain", "c3": "slow2"}


async def test_failing_tools_plain_or_async_are_results_the_model_reads():
    def plain(args, ctx):
        raise ValueError("bad input")

    async def later(args, ctx):
        await asyncio.sleep(0)
        raise KeyError("gone")

    def odd(args, ctx):
        return 42

    prov = FakeProvider(
        "openai", calls(C("c1", "plain"), C("c2", "later"), C("c3", "odd")), say("ok")
    )
    async with await kit(tool("plain", plain), tool("later", later), tool("odd", odd)) as tk:
        result = await prov.client().run("go", tk)
    assert result.status == "done"
    assert prov.results_seen() == {
        "c1": "tool plain failed: ValueError: bad input",
        "c2": "tool later failed: KeyError: 'gone'",
        "c3": "tool odd returned int, not a ToolResult",
    }


async def test_a_toolkit_that_overrides_execute_is_used_as_it_is():
    class Audited(Toolkit):
        def __init__(self, tools):
            super().__init__(tools)
            self.seen: list[str] = []

        async def execute(self, name, args, ctx=None):
            self.seen.append(name)
            return await super().execute(name, args, ctx)

    tk = Audited([tool("a", lambda args, ctx: ToolResult("A"))])
    prov = FakeProvider("openai", calls(C("c1", "a"), C("c2", "a")), say("ok"))
    await prov.client().run("go", tk)
    assert tk.seen == ["a", "a"]


async def test_the_loop_drives_any_model_backend():
    class Scripted:
        dialect = OPENAI
        streams = False

        def __init__(self):
            self.bodies: list[dict] = []
            self.closed = False

        async def complete(self, body, emit):
            self.bodies.append(copy.deepcopy(body))  # the loop's own lists grow on
            if len(self.bodies) == 1:
                reply = {
                    "choices": [
                        {
                            "message": {
                                "role": "assistant",
                                "content": None,
                                "tool_calls": [
                                    {
                                        "id": "c1",
                                        "type": "function",
                                        "function": {"name": "a", "arguments": "{}"},
                                    }
                                ],
                            }
                        }
                    ]
                }
            else:
                reply = {"choices": [{"message": {"role": "assistant", "content": "fin"}}]}
            return OPENAI.parse(reply)

        async def aclose(self):
            self.closed = True

    backend = Scripted()
    async with await create_toolkit(
        builtins=False, extra_tools=[tool("a", lambda args, ctx: "A")]
    ) as tk:
        async with Client(backend=backend, model="m", system_prompt="sys") as client:
            assert client.dialect is OPENAI
            result = await client.run("go", tk)
    assert result.status == "done" and result.text == "fin" and result.turns == 2
    assert backend.bodies[0]["model"] == "m"
    assert backend.bodies[0]["messages"][0] == {"role": "system", "content": "sys"}
    assert backend.bodies[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "A",
    }
    assert backend.closed


async def test_hooks_set_after_construction_apply():
    """The app sets `client.hooks` (and `system_prompt`) on a built client."""
    seen: list[str] = []
    prov = FakeProvider("openai", calls(C("c1", "a")), say("ok"))
    client = prov.client()
    client.hooks = {
        "before_tool": lambda info: seen.append(info["name"]),
        "after_turn": lambda info: seen.append(f"turn {info['turn']}"),
    }
    client.system_prompt = "be brief"
    async with await kit(tool("a", lambda args, ctx: "A")) as tk:
        await client.run("go", tk)
    assert seen == ["a", "turn 1"]
    assert prov.bodies[0]["messages"][0] == {"role": "system", "content": "be brief"}


async def test_a_budget_check_stops_the_run_as_incomplete_before_the_next_model_call():
    seen: list[tuple[int, int, int]] = []

    def budget(turns: int, usage: dict[str, int], tool_calls: int) -> str | None:
        seen.append((turns, usage["total_tokens"], tool_calls))
        return "maxTokens" if usage["total_tokens"] >= 10 else None

    echo = tool("echo", lambda args, ctx: ToolResult("e"))
    prov = FakeProvider(
        "inprocess",
        calls(C("c1", "echo"), usage=(4, 2)),
        calls(C("c2", "echo"), usage=(4, 2)),
        default=say("never asked"),
    )
    async with await kit(echo) as tk:
        result = await prov.client(budget_check=budget).run("go", tk)
    assert (result.status, result.limit, result.turns) == ("incomplete", "maxTokens", 2)
    assert len(prov.bodies) == 2  # the third model call was never made
    assert seen == [(0, 0, 0), (1, 6, 1), (2, 12, 2)]
    assert result.messages[-1]["role"] == "tool"  # the work done is kept
