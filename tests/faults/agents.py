"""Fault injection for tests/faults: loaded into the app's server and worker subprocesses
through `TOOLNEXUS_AGENT_MODULES=tests.faults.agents`.

When `$TOOLNEXUS_FAULTS_DIR` is set (the tests set it in the app's processes; imported by
the tests themselves it only lends its helpers) it registers the `faults` agent: an
in-process model, two relay tools with host executors (`pay`, `ship`), an approval-gated
native tool (`wipe`) and a plain native tool (`stamp`). Also, a 500's traceback is printed
to the process log (with DEBUG off, Django logs it nowhere visible by default).
The prompt picks the flow and where the worker dies, e.g. `faults flow=relay kill=executor
tag=ab12`:

- flow `relay`: turn 1 relays `pay` and `ship` (halts; approved through the API, so the
  executors run in the worker), turn 2 calls `stamp`, turn 3 replies with every tool result;
- flow `gated`: turn 1 calls `wipe` (halts for approval), then as above;
- flow `single`: turn 1 relays `pay`, turn 2 replies.

Kill points (the worker SIGKILLs itself there, the FIRST time only: a marker file in
`$TOOLNEXUS_FAULTS_DIR` makes the restarted worker carry on):

- `executor` / `gated` / `native`: inside `pay` / `wipe` / `stamp`, after its side effect,
  before the worker recorded the execution as finished;
- `relay_turn` / `gated_turn` / `native_turn`: after that turn's tools ran and were recorded,
  before the transcript of the turn was stored (the agent's own `after_turn` hook runs before
  the runner's checkpoint);
- `model`: before the model answers the turn that follows the decided one;
- `final`: after the model's final reply, before it was checkpointed or stored.

Every side effect appends `<tag> <tool> <call id>` to `$TOOLNEXUS_FAULTS_DIR/effects.log`, so
a test counts how often each one really happened.

Two database faults ride on `post_save`, inside the writing transaction: a decision whose
reason contains `slow` sleeps `$TOOLNEXUS_FAULTS_SLOW_SECONDS` when its request row is saved
(a slow path between the decision's row lock and its commit; the audit events of a decision
are one bulk insert, which sends no `post_save`), and a run whose prompt says `kill=db_store`
has its worker's database connection terminated while `run_done` is being stored (once).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from django.core.signals import got_request_exception
from django.db import connection
from django.db.models.signals import post_save

from approvals import agents
from approvals.models import ApprovalRequest, Event, Run
from toolnexus import (
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    Tool,
    ToolResult,
    create_in_process_client,
)
from toolnexus.approval import approval_required
from toolnexus.relay import relay_tool

AGENT = "faults"
DIR_ENV = "TOOLNEXUS_FAULTS_DIR"
SLOW_ENV = "TOOLNEXUS_FAULTS_SLOW_SECONDS"
EFFECTS = "effects.log"
FLOWS = ("relay", "gated", "single")
KILL_POINTS = (
    "executor",
    "relay_turn",
    "gated",
    "gated_turn",
    "model",
    "native",
    "native_turn",
    "final",
)

ARGS_SCHEMA = {
    "type": "object",
    "properties": {
        "tag": {"type": "string"},
        "kill": {"type": "string"},
        "amount": {"type": "number"},
    },
    "required": ["tag", "kill"],
}


def prompt_for(*, tag: str, flow: str = "relay", kill: str = "none") -> str:
    return f"faults flow={flow} kill={kill} tag={tag}"


def parse(prompt: str) -> dict[str, str]:
    found = dict(re.findall(r"\b(flow|kill|tag)=(\S+)", prompt or ""))
    return {"flow": found.get("flow", "relay"), "kill": found.get("kill", "none"), **found}


def _dir() -> Path:
    path = os.environ.get(DIR_ENV)
    if not path:
        raise RuntimeError(f"{DIR_ENV} is not set: the faults agent needs a directory")
    return Path(path)


def record_effect(tag: str, tool: str, call_id: str = "-") -> None:
    """Append one side effect; a plain write(2), so a SIGKILL right after cannot lose it."""
    fd = os.open(_dir() / EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{tag} {tool} {call_id or '-'}\n".encode())
    finally:
        os.close(fd)


def _first_time(name: str) -> bool:
    """True once per marker name across every process (an exclusive create)."""
    try:
        fd = os.open(_dir() / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    return True


def die_once(config: dict[str, Any], point: str) -> None:
    """SIGKILL this process at `point` if the run asked for it and nobody died there yet."""
    if config.get("kill") != point:
        return
    if _first_time(f"killed-{config.get('tag')}-{point}"):
        sys.stderr.write(f"faults: SIGKILL at {point} for tag {config.get('tag')}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # never reached: the signal cannot be caught


# -- the model -----------------------------------------------------------------------------


def _config(messages: list[dict[str, Any]]) -> dict[str, str]:
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return parse(m["content"])
    return parse("")


def _names(messages: list[dict[str, Any]]) -> dict[str, str]:
    return {
        tc["id"]: tc["function"]["name"]
        for m in messages
        if m.get("role") == "assistant"
        for tc in m.get("tool_calls") or []
    }


def generate(request: InProcessRequest) -> InProcessResponse:
    messages = request.messages
    config = _config(messages)
    base = {"tag": config["tag"], "kill": config["kill"]}
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    if turns == 0:
        pay = InProcessToolCall("call_pay", "pay", {**base, "amount": 5})
        if config["flow"] == "gated":
            calls = [InProcessToolCall("call_wipe", "wipe", base)]
        elif config["flow"] == "single":
            calls = [pay]
        else:
            calls = [pay, InProcessToolCall("call_ship", "ship", base)]
        return InProcessResponse(content="working on it", tool_calls=calls)
    if turns == 1:
        die_once(config, "model")
        if config["flow"] != "single":
            return InProcessResponse(
                content="stamping", tool_calls=[InProcessToolCall("call_stamp", "stamp", base)]
            )
    names = _names(messages)
    seen = [
        f"{names.get(m.get('tool_call_id'), '?')}={m.get('content')}"
        for m in messages
        if m.get("role") == "tool"
    ]
    return InProcessResponse(content="model read: " + " | ".join(seen))


# -- hooks: the agent's own run before the runner's checkpoint ---------------------------------


def _after_turn(info: dict[str, Any]) -> None:
    if info.get("pending") is not None:
        return  # the turn halted on a request: that is the normal stop, not a kill point
    messages = info["messages"]
    last = next(
        (m for m in reversed(messages) if m.get("role") == "assistant" and m.get("tool_calls")),
        None,
    )
    names = {tc["function"]["name"] for tc in (last or {}).get("tool_calls") or []}
    config = _config(messages)
    if names & {"pay", "ship"}:
        die_once(config, "relay_turn")
    elif "wipe" in names:
        die_once(config, "gated_turn")
    elif "stamp" in names:
        die_once(config, "native_turn")


def _after_llm(info: dict[str, Any]) -> None:
    messages = info["messages"]
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant" and not last.get("tool_calls"):
        die_once(_config(messages), "final")


# -- tools and executors -------------------------------------------------------------------


def _pay(args: dict[str, Any]) -> str:
    record_effect(args["tag"], "pay")
    die_once(args, "executor")
    return f"paid {args.get('amount')} for {args['tag']}"


def _ship(args: dict[str, Any]) -> str:
    record_effect(args["tag"], "ship")
    return f"shipped {args['tag']}"


def _wipe(args: dict[str, Any], ctx: Any) -> ToolResult:
    record_effect(args["tag"], "wipe", getattr(ctx, "call_id", "") or "")
    die_once(args, "gated")
    return ToolResult(f"wiped {args['tag']}")


def _stamp(args: dict[str, Any], ctx: Any) -> ToolResult:
    record_effect(args["tag"], "stamp", getattr(ctx, "call_id", "") or "")
    die_once(args, "native")
    return ToolResult(f"stamped {args['tag']}")


def tools() -> list[Tool]:
    return [
        relay_tool("pay", "Pay an amount (a host executor runs it once approved).", ARGS_SCHEMA),
        relay_tool("ship", "Ship a parcel (a host executor runs it once approved).", ARGS_SCHEMA),
        approval_required(
            Tool("wipe", "Wipe an account (needs approval).", ARGS_SCHEMA, execute=_wipe),
            prompt=lambda name, args: f"Wipe for {args.get('tag')}?",
        ),
        Tool("stamp", "Stamp the order (runs at once).", ARGS_SCHEMA, execute=_stamp),
    ]


# -- a team: a coordinator delegates to a payer ----------------------------------------------
#
# `faults-team`: the coordinator hands the run's prompt to the `payer` member through `task`;
# the payer relays `pay` (halts at the root; approved through the API, so its executor runs
# in the worker), then calls `stamp` (native, journaled under the payer's handle), then
# replies with both results; the coordinator replies with the payer's text. Kill points of
# the cascade after the approval: `executor` (inside pay), `native` (inside stamp),
# `child_final` (the payer's final reply generated, the coordinator not yet run again) and
# `final` (the coordinator's final reply generated, nothing stored).

TEAM_AGENT = "faults-team"
TEAM_KILL_POINTS = ("executor", "native", "child_final", "final")
COORDINATOR_PROMPT = "agent:coordinator"
PAYER_PROMPT = "agent:payer"


def _member(messages: list[dict[str, Any]]) -> str:
    first = messages[0] if messages else {}
    return str(first.get("content") or "") if first.get("role") == "system" else ""


def team_generate(request: InProcessRequest) -> InProcessResponse:
    messages = request.messages
    config = _config(messages)
    base = {"tag": config["tag"], "kill": config["kill"]}
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    results = [m for m in messages if m.get("role") == "tool"]
    if _member(messages) == COORDINATOR_PROMPT:
        if turns == 0:
            task = {
                "agent": "payer",
                "prompt": next(m["content"] for m in messages if m.get("role") == "user"),
            }
            return InProcessResponse(tool_calls=[InProcessToolCall("call_task", "task", task)])
        return InProcessResponse(content="coordinator read: " + str(results[-1].get("content")))
    if turns == 0:
        return InProcessResponse(
            tool_calls=[InProcessToolCall("call_pay", "pay", {**base, "amount": 7})]
        )
    if turns == 1:
        return InProcessResponse(tool_calls=[InProcessToolCall("call_stamp", "stamp", base)])
    names = _names(messages)
    seen = [f"{names.get(m.get('tool_call_id'), '?')}={m.get('content')}" for m in results]
    return InProcessResponse(content="payer read: " + " | ".join(seen))


def _team_after_llm(info: dict[str, Any]) -> None:
    messages = info["messages"]
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return
    point = "final" if _member(messages) == COORDINATOR_PROMPT else "child_final"
    die_once(_config(messages), point)


def team_members() -> list[Any]:
    from toolnexus.agents import Agent

    return [
        Agent("coordinator", system_prompt=COORDINATOR_PROMPT, tools=[], team=["payer"]),
        Agent("payer", system_prompt=PAYER_PROMPT, tools=["pay", "stamp"]),
    ]


# -- a chain three levels deep: a coordinator delegates to a desk that delegates to a payer --
#
# `faults-chain`: the coordinator hands the run's prompt to `desk` through `task`, the desk
# hands it to `payer` through `task`; the payer relays `pay` (halts at the root, `data.path`
# names the payer three levels down), then calls `stamp`, then replies with both results;
# the desk replies with the payer's text, the coordinator with the desk's. Kill points of the
# cascade after the approval: `deep_final` (the payer's final reply generated: the deepest
# agent resumed and finished, its parent not yet run again), `mid_task` (the desk's `task`
# call answered with the payer's text: a child finished, its parent's turn not yet stored),
# `top_task` (the same one level up: the coordinator's `task` call answered by the desk).

CHAIN_AGENT = "faults-chain"
CHAIN_KILL_POINTS = ("deep_final", "mid_task", "top_task")
DESK_PROMPT = "agent:desk"


def chain_generate(request: InProcessRequest) -> InProcessResponse:
    messages = request.messages
    member = _member(messages)
    if member == PAYER_PROMPT:
        return team_generate(request)
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    results = [m for m in messages if m.get("role") == "tool"]
    if turns == 0:
        task = {
            "agent": "desk" if member == COORDINATOR_PROMPT else "payer",
            "prompt": next(m["content"] for m in messages if m.get("role") == "user"),
        }
        return InProcessResponse(tool_calls=[InProcessToolCall("call_task", "task", task)])
    who = "coordinator" if member == COORDINATOR_PROMPT else "desk"
    return InProcessResponse(content=f"{who} read: " + str(results[-1].get("content")))


def _chain_after_llm(info: dict[str, Any]) -> None:
    messages = info["messages"]
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return
    if _member(messages) == PAYER_PROMPT:
        die_once(_config(messages), "deep_final")


def _chain_after_turn(info: dict[str, Any]) -> None:
    if info.get("pending") is not None:
        return  # the turn halted (on the child's request): the normal stop
    messages = info["messages"]
    last = next(
        (m for m in reversed(messages) if m.get("role") == "assistant" and m.get("tool_calls")),
        None,
    )
    names = {tc["function"]["name"] for tc in (last or {}).get("tool_calls") or []}
    if "task" not in names:
        return
    member = _member(messages)
    point = "top_task" if member == COORDINATOR_PROMPT else "mid_task"
    die_once(_config(messages), point)


def chain_members() -> list[Any]:
    from toolnexus.agents import Agent

    return [
        Agent("coordinator", system_prompt=COORDINATOR_PROMPT, tools=[], team=["desk"]),
        Agent("desk", system_prompt=DESK_PROMPT, tools=[], team=["payer"]),
        Agent("payer", system_prompt=PAYER_PROMPT, tools=["pay", "stamp"]),
    ]


# -- database faults on the audit trail ------------------------------------------------------


def _terminate_own_backend() -> None:
    """Drop this thread's database connection from the server side, as a failover would."""
    import psycopg

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    db = connection.settings_dict
    params = {
        "dbname": db["NAME"],
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
    }
    with psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))
    sys.stderr.write(f"faults: terminated database backend {pid} while storing run_done\n")
    sys.stderr.flush()


def _print_exception(sender, request=None, **kwargs) -> None:
    path = getattr(request, "path", "?")
    sys.stderr.write(f"faults: 500 for {getattr(request, 'method', '?')} {path}\n")
    traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()


def _on_decision(sender, instance: ApprovalRequest, created: bool, **kwargs) -> None:
    if not created and instance.decided_at is not None and "slow" in (instance.reason or ""):
        time.sleep(float(os.environ.get(SLOW_ENV, "0.8")))


def _on_event(sender, instance: Event, created: bool, **kwargs) -> None:
    if not created:
        return
    if instance.action == "run_done" and connection.vendor == "postgresql":
        prompt = Run.objects.filter(pk=instance.run_id).values_list("prompt", flat=True).first()
        config = parse(prompt or "")
        if config["kill"] == "db_store" and _first_time(f"dbdrop-{config.get('tag')}"):
            _terminate_own_backend()


if os.environ.get(DIR_ENV):
    # Only in the app's subprocesses (the tests import this module for its helpers alone).
    agents.register(
        AGENT,
        model=lambda: create_in_process_client(
            generate=generate,
            model="faults-in-process",
            hooks={"after_turn": _after_turn, "after_llm": _after_llm},
        ),
        tools=tools,
        executors={"pay": _pay, "ship": _ship},
        system_prompt="You are a fault-injection agent.",
        description="tests/faults: dies where the prompt says",
        replace=True,
    )
    agents.register(
        TEAM_AGENT,
        model=lambda: create_in_process_client(
            generate=team_generate,
            model="faults-team-in-process",
            hooks={"after_llm": _team_after_llm},
        ),
        tools=tools,
        executors={"pay": _pay, "ship": _ship},
        team=team_members(),
        description="tests/faults: a team that dies where the prompt says",
        replace=True,
    )
    agents.register(
        CHAIN_AGENT,
        model=lambda: create_in_process_client(
            generate=chain_generate,
            model="faults-chain-in-process",
            hooks={"after_llm": _chain_after_llm, "after_turn": _chain_after_turn},
        ),
        tools=tools,
        executors={"pay": _pay, "ship": _ship},
        team=chain_members(),
        description="tests/faults: a three-level chain that dies where the prompt says",
        replace=True,
    )
    post_save.connect(_on_event, sender=Event, dispatch_uid="tests.faults.agents.on_event")
    post_save.connect(
        _on_decision, sender=ApprovalRequest, dispatch_uid="tests.faults.agents.on_decision"
    )
    # With DEBUG off, Django logs a 500's traceback nowhere visible (and a second
    # django.setup() in the ASGI module resets django.request's handlers): print it here.
    got_request_exception.connect(_print_exception, dispatch_uid="tests.faults.agents.500")
