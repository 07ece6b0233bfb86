"""toolnexus.agents.current_handle: a tool sees which handle's loop called it (the app keys
its journal of executions with it), and None outside a runtime."""

from __future__ import annotations

from toolnexus import InProcessResponse, Tool, ToolResult, create_in_process_client
from toolnexus.agents import Agent, Runtime, current_handle
from toolnexus.toolkit import Toolkit


async def test_a_tool_sees_the_handle_that_called_it_and_none_outside():
    seen: list[str | None] = []

    def probe(args, ctx) -> ToolResult:
        seen.append(current_handle())
        return ToolResult("ok")

    def generate(request):
        system = request.messages[0]["content"]
        turns = sum(1 for m in request.messages if m.get("role") == "assistant")
        if turns == 0 and system == "agent:lead":
            return InProcessResponse(
                tool_calls=[
                    {"id": "c1", "name": "probe", "arguments": {}},
                    {"id": "c2", "name": "task", "arguments": {"agent": "member", "prompt": "p"}},
                ]
            )
        if turns == 0:
            return InProcessResponse(tool_calls=[{"id": "c1", "name": "probe", "arguments": {}}])
        return InProcessResponse(content="done")

    kit = Toolkit([Tool("probe", "probe", {"type": "object"}, execute=probe)])
    rt = Runtime(
        [
            Agent("lead", system_prompt="agent:lead", tools=["probe"], team=["member"]),
            Agent("member", system_prompt="agent:member", tools=["probe"]),
        ],
        client=create_in_process_client(generate=generate),
        toolkit=kit,
    )
    result = await rt.run("lead", "go")
    assert result.status == "done"
    assert sorted(seen) == ["root/lead.1", "root/lead.1/member.1"]
    assert current_handle() is None
    await kit.execute("probe", {}, None)
    assert seen[-1] is None
