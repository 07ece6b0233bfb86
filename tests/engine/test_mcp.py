"""MCP servers as tool sources, against real servers (no mocks, loopback only).

The demo server (`mcp_servers/demo_server.py`, the SDK's `MCPServer`) runs as a stdio
subprocess, or over HTTP on 127.0.0.1; the published `mcp-server-time` runs over stdio.
The model is the scripted in-process provider of `helpers.py`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.engine.helpers import C, FakeProvider, Probe, assert_balanced, calls, say
from tests.engine.mcp_servers.harness import (
    DEMO_SERVER,
    PYTHON,
    alive,
    demo,
    events,
    http_server,
    no_leaked_servers,  # noqa: F401  (an autouse fixture)
    server_pids,
)
from toolnexus import Answer, ToolContext, create_toolkit
from toolnexus.mcp import McpServer, McpServerError, resolve_command, servers_of
from toolnexus.relay import answer_output


@pytest.fixture
def log(tmp_path):
    return tmp_path / "demo.jsonl"


# -- listing, namespacing, calls ---------------------------------------------------------------


async def test_lists_the_servers_tools_with_their_json_schemas(log):
    async with await create_toolkit(
        builtins=False, mcp_servers=[demo(log)], disable_tools=["slow"]
    ) as tk:
        assert tk.get("slow") is None  # disabled by the name the model would see
        add = tk.get("add")
        assert add is not None and add.source == "mcp"
        assert add.description == "Add two integers."
        assert add.input_schema["properties"]["a"]["type"] == "integer"
        assert add.input_schema["required"] == ["a", "b"]
        offered = {t["function"]["name"]: t["function"] for t in tk.to_openai()}
        assert offered["add"]["parameters"] == add.input_schema
        assert {"add", "echo", "ask_name", "crash"} <= set(offered)
        status = tk.mcp_status()["demo"]
        assert status["running"] and status["transport"] == "stdio" and status["error"] is None
        assert "add" in status["tools"]


async def test_a_model_calls_mcp_tools_in_a_run(log):
    provider = FakeProvider(
        "inprocess",
        calls(C("c1", "add", {"a": 2, "b": 3}), C("c2", "echo", {"text": "hi"})),
        say("2 + 3 = 5"),
    )
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log)]) as tk:
        result = await provider.client().run("add 2 and 3", tk)
    assert result.status == "done" and result.text == "2 + 3 = 5"
    assert provider.results_seen() == {"c1": "5", "c2": "hi"}
    assert_balanced(result.messages, "openai")


async def test_a_tool_error_of_the_server_is_an_error_result_and_the_run_goes_on(log):
    provider = FakeProvider("inprocess", calls(C("c1", "fail")), say("the disk is full, sorry"))
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log)]) as tk:
        result = await provider.client().run("go", tk)
    assert result.status == "done"
    assert "the disk is full" in provider.results_seen()["c1"]
    assert result.tool_calls[0]["is_error"] is True


async def test_colliding_names_are_prefixed_with_their_server_on_every_side(log):
    host_echo = Probe("echo", "host echo")
    servers = [demo(log, "alpha"), demo(log, "beta", prefix=False)]
    async with await create_toolkit(
        builtins=True, extra_tools=[host_echo.tool], mcp_servers=servers
    ) as tk:
        names = {t.name for t in tk.tools()}
        # both servers offer `add`: neither keeps the bare name
        assert {"alpha__add", "beta__add"} <= names and "add" not in names
        # the host's own tool and the builtin keep their names
        assert tk.get("echo").source == "native" and tk.get("question").source == "builtin"
        assert await tk.execute("alpha__add", {"a": 1, "b": 1}) == await tk.execute(
            "beta__add", {"a": 1, "b": 1}
        )
        assert (await tk.execute("echo", {"text": "x"})).output == "host echo"
        assert (await tk.execute("alpha__echo", {"text": "x"})).output == "x"


async def test_a_name_is_only_prefixed_when_it_collides_or_when_asked(log):
    async with await create_toolkit(
        builtins=False, extra_tools=[Probe("echo").tool], mcp_servers=[demo(log, "solo")]
    ) as tk:
        names = {t.name for t in tk.tools()}
    assert "solo__echo" in names and "echo" in names  # the host's echo keeps its name
    assert "add" in names and "solo__add" not in names  # no collision: the bare name
    async with await create_toolkit(
        builtins=False, mcp_servers=[demo(log, "pre", prefix=True)]
    ) as tk:
        assert all(t.name.startswith("pre__") for t in tk.tools())


async def test_approval_and_relay_declared_by_pattern_reuse_the_engine_gates(log):
    spec = demo(log, approval=["delete_*"], relay=["ref*"])
    provider = FakeProvider(
        "inprocess",
        calls(C("c1", "delete_item", {"item": "report"})),
        calls(C("c2", "refund", {"amount": 5})),
        say("done"),
    )
    async with await create_toolkit(builtins=False, mcp_servers=[spec]) as tk:
        assert tk.get("refund").source == "relay"
        client = provider.client()
        halted = await client.run("clean up", tk)
        assert halted.status == "pending" and halted.pending.kind == "approval"
        assert halted.pending.data["input"] == {"item": "report"}
        assert not [e for e in events(log, "call") if e["tool"] == "delete_item"]

        relayed = await client.run_with_answer(
            tk, halted.messages, halted.pending, _ok(halted.pending.id)
        )
        assert [e["item"] for e in events(log, "call") if e["tool"] == "delete_item"] == ["report"]
        assert provider.results_seen()["c1"] == "deleted report"
        assert relayed.status == "pending" and relayed.pending.kind == "tool_call"
        assert relayed.pending.data["calls"][0]["name"] == "refund"

        done = await client.run_with_answer(
            tk, relayed.messages, relayed.pending, answer_output(relayed.pending.id, "host paid 5")
        )
    assert done.status == "done"
    assert provider.results_seen()["c2"] == "host paid 5"
    assert not [e for e in events(log, "call") if e["tool"] == "refund"]  # the host decided


async def test_patterns_that_match_nothing_warn_and_one_tool_cannot_be_both(log):
    with pytest.warns(UserWarning, match=r"approval pattern 'remove_\*' matches none"):
        async with await create_toolkit(
            builtins=False, mcp_servers=[demo(log, approval=["remove_*"])]
        ):
            pass
    with pytest.raises(ValueError, match="both a relay and an approval pattern"):
        await create_toolkit(
            builtins=False, mcp_servers=[demo(log, approval=["delete_*"], relay=["*item"])]
        )


# -- failures ----------------------------------------------------------------------------------


async def test_a_server_dying_mid_call_is_a_clear_error_and_the_run_goes_on(log):
    provider = FakeProvider(
        "inprocess",
        calls(C("c1", "crash")),
        calls(C("c2", "add", {"a": 1, "b": 2})),
        say("recovered"),
    )
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log)]) as tk:
        started = time.monotonic()
        result = await provider.client().run("go", tk)
        assert time.monotonic() - started < 20
    assert result.status == "done" and result.text == "recovered"
    crashed = provider.results_seen(1)["c1"]
    assert 'MCP server "demo" stopped before answering the call to crash' in crashed
    assert "crashing on purpose" in crashed  # the last words on its stderr
    assert result.tool_calls[0]["is_error"] is True
    # the next call started the server again
    assert provider.results_seen()["c2"] == "3"
    assert len(server_pids(log)) == 2
    assert_balanced(result.messages, "openai")


async def test_a_server_that_cannot_restart_gives_the_model_an_error(log, tmp_path):
    flag = tmp_path / "broken"
    # The server starts once; its second start fails (the flag makes it exit at once).
    script = tmp_path / "flaky.py"
    script.write_text(
        "import os, runpy, sys\n"
        f"if os.path.exists({str(flag)!r}): sys.exit('cannot start today')\n"
        f"sys.argv = [{DEMO_SERVER!r}]\n"
        f"runpy.run_path({DEMO_SERVER!r}, run_name='__main__')\n"
    )
    spec = McpServer.stdio("flaky", PYTHON, str(script), env={"DEMO_MCP_LOG": str(log)})
    async with await create_toolkit(builtins=False, mcp_servers=[spec]) as tk:
        await tk.execute("crash", {})
        flag.write_text("x")
        result = await tk.execute("add", {"a": 1, "b": 2})
    assert result.is_error
    assert result.output.startswith("add was not run: ")
    assert 'MCP server "flaky" failed to start' in result.output
    assert "cannot start today" in result.output


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            McpServer.stdio("nope", "/no/such/mcp-server"),
            "cannot run '/no/such/mcp-server'",
        ),
        (
            McpServer.stdio("early", PYTHON, "-c", "import sys; sys.exit('config file missing')"),
            "config file missing",
        ),
        (
            McpServer.stdio("mute", PYTHON, "-c", "import time; time.sleep(30)", start_timeout=1),
            "no answer within 1s",
        ),
        (McpServer.http("down", "http://127.0.0.1:9/mcp"), "cannot connect"),
    ],
    ids=["missing-command", "exits-at-once", "never-answers", "refused-connection"],
)
async def test_a_server_that_fails_to_start_is_a_clear_error(spec, expected):
    started = time.monotonic()
    with pytest.raises(McpServerError) as raised:
        await create_toolkit(builtins=False, mcp_servers=[spec])
    assert time.monotonic() - started < 15
    message = str(raised.value)
    assert f'MCP server "{spec.name}" failed to start' in message
    assert expected in message
    assert raised.value.server == spec.name


async def test_an_optional_server_that_fails_is_left_out_with_a_warning(log):
    broken = McpServer.stdio("broken", "/no/such/mcp-server", required=False)
    with pytest.warns(UserWarning, match='MCP server "broken" failed to start'):
        tk = await create_toolkit(builtins=False, mcp_servers=[demo(log), broken])
    async with tk:
        assert tk.get("add") is not None
        status = tk.mcp_status()
        assert status["broken"]["running"] is False and "cannot run" in status["broken"]["error"]


async def test_a_call_to_a_tool_of_a_server_that_did_not_start_is_an_error_naming_it(log):
    """The server's tools were never listed, so the model is not offered them; a call to one
    anyway (a halted call resumed, a name from earlier turns) reads which server is down and
    why, and the run goes on."""
    gone = McpServer.stdio(
        "gone", PYTHON, "-c", "import sys; sys.exit('no licence key')", required=False
    )
    provider = FakeProvider(
        "inprocess",
        calls(C("c1", "gone__lookup", {"q": "x"}), C("c2", "add", {"a": 1, "b": 2})),
        say("the lookup service is down; 1 + 2 = 3"),
    )
    with pytest.warns(UserWarning, match='MCP server "gone" failed to start'):
        tk = await create_toolkit(builtins=False, mcp_servers=[demo(log), gone])
    async with tk:
        assert not any(t.name.startswith("gone") for t in tk.tools())
        started = time.monotonic()
        result = await provider.client().run("look it up", tk)
        assert time.monotonic() - started < 20
    assert result.status == "done" and result.text == "the lookup service is down; 1 + 2 = 3"
    seen = provider.results_seen()
    assert seen["c1"].startswith(
        'gone__lookup was not run: MCP server "gone" is unavailable, so its tools are not '
        'offered (MCP server "gone" failed to start (command '
    )
    assert "no licence key" in seen["c1"]  # the last words on its stderr
    assert result.tool_calls[0]["is_error"] is True
    assert seen["c2"] == "3"  # the server that started works as ever
    # without a failed server an unknown name reads as before
    async with await create_toolkit(builtins=False, mcp_servers=[demo(log)]) as tk:
        assert (await tk.execute("nope", {})).output == "Unknown tool: nope"


async def test_a_required_failure_closes_the_servers_already_started(log):
    with pytest.raises(McpServerError):
        await create_toolkit(
            builtins=False, mcp_servers=[demo(log), McpServer.stdio("nope", "/no/such/server")]
        )
    # the demo server had started: it is stopped (the fixture checks no process is left)
    assert server_pids(log)


async def test_a_call_that_outlives_its_timeout_is_cancelled_with_an_error(log):
    async with await create_toolkit(
        builtins=False, mcp_servers=[demo(log, call_timeout=0.5)]
    ) as tk:
        started = time.monotonic()
        slow = await tk.execute("slow", {"seconds": 10})
        assert time.monotonic() - started < 5
        assert slow.is_error
        assert (
            slow.output
            == 'MCP tool slow (server "demo") did not finish within 0.5s; the call was cancelled'
        )
        assert (await tk.execute("add", {"a": 1, "b": 1})).output == "2"


async def test_close_stops_the_server_and_later_calls_fail_clearly(log):
    tk = await create_toolkit(builtins=False, mcp_servers=[demo(log)])
    assert (await tk.execute("add", {"a": 1, "b": 1})).output == "2"
    (pid,) = server_pids(log)
    assert alive(pid)
    await tk.aclose()
    assert not alive(pid)
    await tk.aclose()  # idempotent
    late = await tk.get("add").execute({"a": 1, "b": 1}, ToolContext())
    assert late.is_error and "is closed" in late.output


async def test_close_from_another_task_than_the_one_that_started(log):
    tk = await asyncio.create_task(create_toolkit(builtins=False, mcp_servers=[demo(log)]))
    (pid,) = server_pids(log)
    await asyncio.create_task(tk.aclose())
    assert not alive(pid)


async def test_missing_sdk_names_the_optional_extra(monkeypatch, log):
    from toolnexus.mcp import answer_to_elicit_result
    from toolnexus.relay import answer_declined

    monkeypatch.setitem(sys.modules, "mcp.types", None)
    with pytest.raises(ImportError, match=r"toolnexus-web\[mcp\]"):
        await create_toolkit(builtins=False, mcp_servers=[demo(log)])
    with pytest.raises(ImportError, match=r"toolnexus-web\[mcp\]"):
        answer_to_elicit_result(answer_declined("r"))
    # without servers nothing needs the SDK
    async with await create_toolkit(builtins=True):
        pass


# -- configuration -----------------------------------------------------------------------------


def test_servers_from_the_common_configuration_shape():
    specs = servers_of(
        {
            "mcpServers": {
                "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
                "files": {
                    "url": "https://files.example/mcp",
                    "headers": {"Authorization": "Bearer t"},
                    "type": "http",
                    "approval": ["delete_*"],
                    "call_timeout": 5,
                },
                "legacy": {"url": "https://old.example/sse", "type": "sse"},
            }
        }
    )
    time_, files, legacy = specs
    assert (time_.transport, time_.args) == ("stdio", ("--local-timezone", "UTC"))
    assert (files.transport, files.approval, files.call_timeout) == (
        "streamable-http",
        ("delete_*",),
        5,
    )
    assert legacy.transport == "sse"
    assert McpServer.http("h", "http://x/mcp").transport == "auto"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"command": "x", "approvals": ["*"]}, "unknown configuration key 'approvals'"),
        ({"command": "x", "url": "http://x"}, "exactly one of command or url"),
        ({}, "exactly one of command or url"),
        ({"url": "http://x", "type": "stdio"}, "does not fit a url"),
        ({"command": "x", "protocol": "newest"}, "protocol must be"),
        ({"command": "x", "call_timeout": 0}, "call_timeout must be positive"),
    ],
)
def test_a_wrong_configuration_is_refused_naming_the_problem(config, message):
    with pytest.raises(ValueError, match=message):
        servers_of({"s": config})


def test_two_servers_of_one_name_are_refused():
    with pytest.raises(ValueError, match="used twice: a"):
        servers_of([McpServer.stdio("a", "x"), McpServer.stdio("a", "y")])


# -- the published time server, and HTTP transports --------------------------------------------


async def test_the_published_time_server_over_stdio():
    spec = McpServer.stdio(
        "time", PYTHON, "-m", "mcp_server_time", "--local-timezone", "UTC", approval=["convert_*"]
    )
    provider = FakeProvider(
        "inprocess",
        calls(
            C(
                "c1",
                "convert_time",
                {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
            ),
            C("c2", "get_current_time", {"timezone": "Nowhere/Atlantis"}),
        ),
        say("It is 21:00 in Tokyo."),
    )
    async with await create_toolkit(builtins=False, mcp_servers=[spec]) as tk:
        assert {t.name for t in tk.tools()} == {"get_current_time", "convert_time"}
        client = provider.client()
        halted = await client.run("noon UTC in Tokyo?", tk)
        assert halted.pending.kind == "approval" and halted.pending.data["tool"] == "convert_time"
        done = await client.run_with_answer(
            tk, halted.messages, halted.pending, _ok(halted.pending.id)
        )
    assert done.status == "done"
    seen = provider.results_seen()
    assert '"datetime": "' in seen["c1"] and "T21:00:00+09:00" in seen["c1"]
    assert "Invalid timezone" in seen["c2"]


def test_a_bare_command_is_found_beside_the_running_interpreter_first(tmp_path):
    """A server installed into the app's environment (its `bin`, the running interpreter's
    scripts directory) is found there, before PATH; anything else is left to PATH."""
    bin_dir = Path(sys.executable).parent
    installed = bin_dir / "mcp-server-time"
    if not installed.exists():
        pytest.skip("mcp-server-time is not installed beside this interpreter")
    assert resolve_command("mcp-server-time") == str(installed)
    assert resolve_command("no-such-mcp-server") == "no-such-mcp-server"  # PATH decides
    assert resolve_command(PYTHON) == PYTHON  # a path is never searched for
    assert resolve_command("./mcp-server-time") == "./mcp-server-time"


async def test_a_server_installed_in_the_apps_environment_starts_without_its_bin_on_path(
    monkeypatch,
):
    """`./dev run` or a bare `.venv/bin/python manage.py serve`: the venv's bin is not on
    PATH, and `mcp-server-time` (installed there by the `mcp` extra) still starts."""
    if not (Path(sys.executable).parent / "mcp-server-time").exists():
        pytest.skip("mcp-server-time is not installed beside this interpreter")
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != bin_dir
    )
    monkeypatch.setenv("PATH", path or os.defpath)
    if shutil.which("mcp-server-time") is not None:
        pytest.skip("another mcp-server-time is on PATH: nothing to prove")
    spec = McpServer.stdio("time", "mcp-server-time", "--local-timezone", "UTC")
    async with await create_toolkit(builtins=False, mcp_servers=[spec]) as tk:
        assert {t.name for t in tk.tools()} == {"get_current_time", "convert_time"}
        result = await tk.execute("get_current_time", {"timezone": "UTC"}, ToolContext())
    assert '"timezone": "UTC"' in result.output


async def test_streamable_http_with_headers(log):
    with http_server("http", log, token="s3cret") as base:
        spec = McpServer.http("web", f"{base}/mcp", headers={"X-Demo-Token": "s3cret"})
        provider = FakeProvider("inprocess", calls(C("c1", "add", {"a": 20, "b": 22})), say("42"))
        async with await create_toolkit(builtins=False, mcp_servers=[spec]) as tk:
            assert tk.mcp_status()["web"]["transport"] == "streamable-http"
            result = await provider.client().run("add", tk)
        assert result.status == "done" and provider.results_seen()["c1"] == "42"

        with pytest.raises(McpServerError, match=r'MCP server "anon" failed to start'):
            await create_toolkit(
                builtins=False,
                mcp_servers=[McpServer.http("anon", f"{base}/mcp", transport="streamable-http")],
            )


async def test_an_sse_only_server_is_reached_through_the_fallback(log):
    with http_server("sse", log) as base:
        spec = McpServer.http("old", f"{base}/sse")  # transport "auto"
        async with await create_toolkit(builtins=False, mcp_servers=[spec]) as tk:
            assert tk.mcp_status()["old"]["transport"] == "sse"
            assert (await tk.execute("echo", {"text": "over sse"})).output == "over sse"


# -- helpers -----------------------------------------------------------------------------------


def _ok(request_id, data=None):
    return Answer(id=request_id, ok=True, data=data)
