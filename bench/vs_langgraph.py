"""The decision path at the floor: toolnexus-web against LangGraph + PostgresSaver.

The same workload on both systems, in one run, against one PostgreSQL (127.0.0.1:5432, user
postgres, trust auth), each system on a database of its own (`bench_lg_<hex>`,
`bench_tw_<hex>`, created here and dropped at exit; the tests' `test` database is never
touched):

* LangGraph (installed into a bench-only venv, `bench/.venvs/langgraph-1.2`, never a
  dependency of the project): a StateGraph `model -> tools -> model` whose tool node calls
  `interrupt()` for the approval; started with `graph.invoke(input, config)` until it returns
  `__interrupt__`, resumed with `graph.invoke(Command(resume=...), config)` to the end, with
  `PostgresSaver.from_conn_string(...)` and LangGraph's default durability.
* toolnexus-web (this repo): `services.run_start(...)` then the worker loop
  (`approvals.worker.Worker.run_forever`, the loop `db_worker` runs) takes the run to its
  pending request; `services.request_approve(...)` / `services.request_decline(...)` then the
  worker loop resumes it to `done`.

A phase pair runs without a person, the approval decided by policy (amount <= $1000, every
prompt's amount under it):

* toolnexus-web `rule`: an enabled Rule approves `refund` for the agent
  (`args.amount <= 1000`); `services.run_start(...)` then the worker loop takes each run to
  `done` in one step (the rule decides where the run would halt; no pending request).
* LangGraph `coded`: the same graph whose tool node decides in code (no `interrupt()`), one
  `graph.invoke(input, config)` from the prompt to the end, PostgresSaver, default
  durability.

Both use the same in-process fake model (`fake_model` below): the first turn asks for one
`refund {order, amount}` call, the turn after the tool result replies with a text that reads
it (an approval's executor output, or the reviewer's decline reason).

    python bench/vs_langgraph.py                  # N=500, 3 rounds
    python bench/vs_langgraph.py --quick          # N=50, 1 round: a smoke check
    python bench/vs_langgraph.py --runs 200 --rounds 5 --no-pool
    python bench/vs_langgraph.py --runs 200 --rule-only   # the rule / coded pair alone

Every phase of every round runs in fresh processes (this script with a hidden `--child`
flag), after a warm-up; see bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import operator
import os
import platform
import queue
import re
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
ADMIN_DSN = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/postgres"
RESERVED_DB_NAMES = {"postgres", "template0", "template1", "test", "test_test"}

LANGGRAPH_VERSION = "1.2.22"
CHECKPOINT_POSTGRES_VERSION = "3.2.0"
PSYCOPG_VERSION = "3.3.9"  # the same psycopg the project's venv has
DEFAULT_VENV = BENCH_DIR / ".venvs" / "langgraph-1.2"

REVIEWER = "bench-reviewer"
DECIDE_PERMISSION = "approvals.decide_request"
TW_AGENT = "bench_refund"
SERVICES, LOOP = "main: services calls", "main: worker loop"
DECLINE_REASON = "amount exceeds refund policy"
# The policy of the `rule` / `coded` phases: toolnexus-web's rule (a CEL condition) and
# LangGraph's tool node (Python) approve a refund up to this amount; every prompt's amount
# (`prompt_for`: $10 to $909) is under it, so every call is approved.
POLICY_LIMIT = 1000
RULE_NAME = "vs_langgraph: refunds up to $1000"
RULE_CONDITION = f"args.amount <= {POLICY_LIMIT}"
SYSTEM_PROMPT = "You are a support agent. Refunds need a human's approval."
REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "string", "description": "Order number"},
        "amount": {"type": "number", "minimum": 0, "maximum": 10000},
    },
    "required": ["order", "amount"],
    "additionalProperties": False,
}

RESULT_MARK = "@@RESULT "
READY_MARK = "@@READY"
LG, TW = "langgraph", "toolnexus-web"


# --------------------------------------------------------------------------------------- #
# The workload, shared by both sides (runs in the children)
# --------------------------------------------------------------------------------------- #


def prompt_for(label: int) -> str:
    return f"Refund order A-{label}, ${10 + label % 900}"


def issue_refund(args: dict[str, Any]) -> str:
    """The host executor of `refund` on both sides (pretends to call a payments system)."""
    return f"refund issued: ${args['amount']} to order {args['order']}"


def decline_text(name: str, reason: str) -> str:
    # The text toolnexus' relay gives the model for a declined call (toolnexus.relay).
    return f"relay declined for {name}: {reason}"


def fake_model(
    messages: list[dict[str, Any]],
) -> tuple[str, list[tuple[str, str, dict]]]:
    """The in-process model: (text, tool calls). OpenAI-shaped messages in, as both keep."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    if last < 0:
        prompt = next(
            (m["content"] for m in messages if m.get("role") == "user" and m.get("content")),
            "",
        )
        order = re.search(r"\b[A-Z]-\d{3,}\b", prompt)
        amount = re.search(r"\$\s*(\d+(?:\.\d+)?)", prompt)
        value = float(amount.group(1)) if amount else 250
        args = {
            "order": order.group(0) if order else "A-1001",
            "amount": int(value) if value == int(value) else value,
        }
        return "Let me take care of that.", [("call_refund", "refund", args)]
    lines = []
    for m in messages[last + 1 :]:
        if m.get("role") != "tool":
            continue
        out = m.get("content") or ""
        if out.startswith("relay declined for"):
            why = out.split(": ", 1)[1] if ": " in out else "declined"
            lines.append(
                f"I did not run refund: the reviewer declined it ({why}). "
                "I can offer store credit or escalate to a manager instead."
            )
        else:
            lines.append(f"Done with refund: {out}.")
    return " ".join(lines) or "All done.", []


# --------------------------------------------------------------------------------------- #
# Measuring inside a child: statements, backend CPU, transactions
# --------------------------------------------------------------------------------------- #

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int | str, base: str = "/proc") -> float | None:
    """CPU seconds of a (single-threaded) process or of one thread, None once it is gone.

    From `schedstat` (nanoseconds on the CPU): `stat`'s utime + stime come in 10 ms clock
    ticks, and truncating every short-lived backend (a connection per task without the pool)
    to 10 ms loses several ms per backend."""
    try:
        return int(Path(f"{base}/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        pass
    try:
        fields = Path(f"{base}/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def context_switches() -> tuple[int, int]:
    """(voluntary, involuntary) context switches of this process, all its threads, those
    that ended included (getrusage): a voluntary one is a thread waiting (for PostgreSQL's
    reply, a commit's flush, another thread, a lock), an involuntary one a thread put off
    the CPU for another (here, mostly the machine's other work)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_nvcsw, use.ru_nivcsw


def _thread_group(name: str) -> str:
    if name.startswith("toolnexus-push"):
        return "live-push lanes"
    if name.startswith("toolnexus-worker-"):  # the worker's task thread (its loop is main's)
        return "worker thread"
    if name == "MainThread":
        return "main"
    return "other threads"


def _kind(query: Any) -> str:
    if isinstance(query, bytes):
        query = query.decode(errors="replace")
    if not isinstance(query, str):
        return type(query).__name__
    words = query.strip().split(None, 1)
    return words[0].upper() if words else "(empty: pool check)"


class Meter:
    """Counts the SQL statements this process sends (psycopg `Cursor.execute`/`executemany`,
    one per parameter set; Django's ORM and LangGraph's saver both go through them), the CPU
    of this process and of the PostgreSQL backends serving it (from /proc), and the bench
    database's transactions (pg_stat_database, read once every connection is closed so that
    the backends have flushed their counters)."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.active = False
        self.lock = threading.Lock()
        self.statements = 0
        self.kinds: Counter[str] = Counter()
        self.by_thread: Counter[str] = Counter()
        self.stage = "main"  # what the main thread is doing (its statements are split by it)
        self.stage_cpu: Counter[str] = Counter()
        self.closed: dict[int, float] = {}  # backends whose connection closed mid-phase
        self.base: dict[int, float] = {}
        self.mon = None

    def install(self) -> None:
        import psycopg

        meter = self
        run_one, run_many = psycopg.Cursor.execute, psycopg.Cursor.executemany
        close_conn = psycopg.Connection.close

        def execute(cur, query, params=None, *args, **kwargs):
            if meter.active:
                meter._count(query, 1)
            return run_one(cur, query, params, *args, **kwargs)

        def executemany(cur, query, params_seq, *args, **kwargs):
            if meter.active:
                params_seq = list(params_seq)
                meter._count(query, len(params_seq))
            return run_many(cur, query, params_seq, *args, **kwargs)

        def close(conn):
            if meter.active and not conn.closed:
                try:
                    if conn.info.dbname == meter.db:
                        pid = conn.info.backend_pid
                        cpu = cpu_of(pid)
                        if cpu is not None:
                            meter.closed[pid] = cpu
                except Exception:
                    pass
            return close_conn(conn)

        psycopg.Cursor.execute = execute
        psycopg.Cursor.executemany = executemany
        psycopg.Connection.close = close
        self.mon = psycopg.connect(ADMIN_DSN + "?application_name=bench_monitor", autocommit=True)

    def _count(self, query: Any, n: int) -> None:
        kind = _kind(query)
        name = threading.current_thread().name
        if name == "bench-done-watch":
            return  # the bench's own "is the phase done" polling
        group = self.stage if name == "MainThread" else _thread_group(name)
        with self.lock:
            self.statements += n
            self.kinds[kind] += n
            self.by_thread[group] += n

    @staticmethod
    def thread_cpu() -> dict[str, float]:
        """CPU seconds per thread group of this process (threads alive now)."""
        out: Counter[str] = Counter()
        for t in threading.enumerate():
            cpu = cpu_of(t.native_id, "/proc/self/task") if t.native_id else None
            if cpu is not None:
                out[_thread_group(t.name)] += cpu
        return dict(out)

    def backends(self) -> list[int]:
        rows = self.mon.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
            [self.db],
        ).fetchall()
        return [r[0] for r in rows]

    def xacts(self) -> int:
        row = self.mon.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [self.db],
        ).fetchone()
        return int(row[0])

    def settled_xacts(self, timeout: float = 15.0) -> tuple[int, bool]:
        """Wait until no client backend is connected to the bench database (so each has
        flushed its statistics), then until the counter stops moving; (count, settled)."""
        end = time.monotonic() + timeout
        while self.backends() and time.monotonic() < end:
            time.sleep(0.02)
        settled = not self.backends()
        last = self.xacts()
        for _ in range(40):
            time.sleep(0.05)
            now = self.xacts()
            if now == last:
                break
            last = now
        return last, settled

    def start(self) -> None:
        self.base = {}
        for pid in self.backends():
            cpu = cpu_of(pid)
            if cpu is not None:
                self.base[pid] = cpu
        self.closed = {}
        self.statements = 0
        self.kinds = Counter()
        self.by_thread = Counter()
        self.stage_cpu = Counter()
        self.threads0 = self.thread_cpu()
        self.load0 = os.getloadavg()[0]
        self.cpu0 = os.times()
        self.switches0 = context_switches()
        self.t0 = time.monotonic()
        self.active = True

    def stop(self) -> dict[str, Any]:
        t1 = time.monotonic()
        cpu1 = os.times()
        switches1 = context_switches()
        threads1 = self.thread_cpu()
        self.active = False
        seen = dict(self.closed)
        for pid in self.backends():
            cpu = cpu_of(pid)
            if cpu is not None:
                seen[pid] = cpu
        backend_cpu = sum(cpu - self.base.get(pid, 0.0) for pid, cpu in seen.items())
        thread_cpu = {k: v - self.threads0.get(k, 0.0) for k, v in threads1.items()}
        if self.stage_cpu and "main" in thread_cpu:
            main = thread_cpu.pop("main")
            thread_cpu.update(self.stage_cpu)
            thread_cpu["main: other"] = max(0.0, main - sum(self.stage_cpu.values()))
        proc_cpu = (cpu1.user - self.cpu0.user) + (cpu1.system - self.cpu0.system)
        return {
            "t0": self.t0,
            "t1": t1,
            "cpu_proc": proc_cpu,
            "cpu_pg": backend_cpu,
            "backends": len(seen),
            "statements": self.statements,
            "kinds": dict(self.kinds),
            "by_thread": dict(self.by_thread),
            "thread_cpu": thread_cpu,
            "load": [self.load0, os.getloadavg()[0]],
            "switches": [b - a for a, b in zip(self.switches0, switches1, strict=True)],
        }


def _wait_go(sync: bool) -> None:
    print(READY_MARK, flush=True)
    if sync:
        line = sys.stdin.readline()
        if line.strip() != "GO":
            raise SystemExit("parent went away before GO")


def _emit(result: dict[str, Any]) -> None:
    print(RESULT_MARK + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------- #
# LangGraph child (runs with the bench venv's python; never imports Django)
# --------------------------------------------------------------------------------------- #


def lg_dsn(db: str) -> str:
    return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{db}?application_name=bench_lg"


class State(TypedDict):
    """The LangGraph side's state: OpenAI-shaped message dicts, appended by each node."""

    messages: Annotated[list, operator.add]


def coded_decision(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The LangGraph side's approval decided in code (the `coded` phase): the same policy as
    toolnexus-web's rule in the `rule` phase."""
    if name == "refund" and args.get("amount", POLICY_LIMIT + 1) <= POLICY_LIMIT:
        return {"approved": True}
    return {"approved": False, "reason": DECLINE_REASON}


def lg_build(saver: Any, coded: bool = False) -> Any:
    """The graph; `coded`: its tool node decides the approval in code (no interrupt)."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def model(state: State) -> dict[str, Any]:
        text, calls = fake_model(state["messages"])
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            msg["tool_calls"] = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for cid, name, args in calls
            ]
        return {"messages": [msg]}

    def tools(state: State) -> dict[str, Any]:
        out = []
        for call in state["messages"][-1]["tool_calls"]:
            name = call["function"]["name"]
            args = json.loads(call["function"]["arguments"])
            if coded:
                decision = coded_decision(name, args)
            else:
                decision = interrupt({"tool": name, "input": args, "call_id": call["id"]})
            if decision.get("approved"):
                content = issue_refund(args)
            else:
                content = decline_text(name, decision.get("reason") or "declined")
            out.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        return {"messages": out}

    def route(state: State) -> str:
        return "tools" if state["messages"][-1].get("tool_calls") else END

    g = StateGraph(State)
    g.add_node("model", model)
    g.add_node("tools", tools)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    return g.compile(checkpointer=saver)


def lg_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in (
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-postgres",
        "langchain-core",
        "psycopg",
        "psycopg-binary",
        "psycopg-pool",
        "ormsgpack",
    ):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def lg_child(spec: dict[str, Any]) -> dict[str, Any]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.types import Command

    db, phase = spec["db"], spec["phase"]
    dsn = lg_dsn(db)
    if phase == "setup":
        with PostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
        return {"versions": lg_versions()}

    meter = Meter(db)
    meter.install()

    def config(tid: str) -> dict[str, Any]:
        return {"configurable": {"thread_id": tid}}

    def start(graph: Any, label: int) -> str:
        tid = f"t{label}"
        state = {
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": prompt_for(label)},
            ]
        }
        out = graph.invoke(state, config(tid))
        if "__interrupt__" not in out:
            raise AssertionError(f"thread {tid} did not halt: {out!r}")
        return tid

    def resume(graph: Any, tid: str, decision: str) -> None:
        if decision == "approve":
            cmd = Command(resume={"approved": True})
        else:
            cmd = Command(resume={"approved": False, "reason": DECLINE_REASON})
        out = graph.invoke(cmd, config(tid))
        text = out["messages"][-1]["content"]
        want = "refund issued" if decision == "approve" else DECLINE_REASON
        if want not in text or "__interrupt__" in out:
            raise AssertionError(f"thread {tid} ended with {text!r}")

    def to_end(graph: Any, label: int) -> str:
        """The `coded` phase: one invoke from the prompt to the end, the approval in code."""
        tid = f"c{label}"
        state = {
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": prompt_for(label)},
            ]
        }
        out = graph.invoke(state, config(tid))
        text = out["messages"][-1]["content"]
        if "__interrupt__" in out or "refund issued" not in text:
            raise AssertionError(f"thread {tid} ended with {text!r}")
        return tid

    coded = phase == "coded"

    def do(graph: Any, items: list[Any]) -> list[Any]:
        if phase == "halt":
            return [start(graph, label) for label in items]
        if coded:
            return [to_end(graph, label) for label in items]
        for tid in items:
            resume(graph, tid, spec["decision"])
        return items

    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = lg_build(saver, coded)
        do(graph, spec["warm"])
    # Every connection closed: the backends flushed their statistics.
    xact0, settled0 = meter.settled_xacts() if spec["measure"] else (0, True)
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = lg_build(saver, coded)
        _wait_go(spec["sync"])
        meter.start()
        ids = do(graph, spec["timed"])
        m = meter.stop()
    if spec["measure"]:
        xact1, settled1 = meter.settled_xacts()
        m["xacts"] = xact1 - xact0
        m["settled"] = settled0 and settled1
    m["n"] = len(spec["timed"])
    if phase == "halt":
        m["checks"] = "every thread halted on its interrupt"
    elif coded:
        m["checks"] = "every thread ran to the end in one invoke, approved in code, no interrupt"
    else:
        m["checks"] = f"every thread ended with the expected text ({spec['decision']})"
    if phase == "halt":
        m["ids"] = dict(zip(map(str, spec["timed"]), ids, strict=True))
        with PostgresSaver.from_conn_string(dsn) as saver:
            graph = lg_build(saver)
            for label in spec["prep"]:
                m["ids"][str(label)] = start(graph, label)
    return m


# --------------------------------------------------------------------------------------- #
# toolnexus-web child (runs with the project's python; Django settings from the env)
# --------------------------------------------------------------------------------------- #


def _tw_import(modules: list[str], names: list[str]) -> list[Any]:
    """Import names from the first of `modules` that has them. The app's modules move into
    subpackages now and then (approvals.worker -> approvals.execution.worker, ...), so at
    last search approvals/ for a module defining the first name."""
    import importlib

    for module in modules:
        try:
            mod = importlib.import_module(module)
            return [getattr(mod, n) for n in names]
        except (ImportError, AttributeError):
            continue
    pkg = ROOT / "approvals"
    first = names[0]
    for path in sorted(pkg.rglob("*.py")):
        text = path.read_text(errors="replace")
        if re.search(rf"^(def|class) {re.escape(first)}\b|^{re.escape(first)} = ", text, re.M):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mod = importlib.import_module(dotted)
            try:
                return [getattr(mod, n) for n in names]
            except AttributeError:
                continue
    raise ImportError(f"cannot find {names} (looked in {modules} and under approvals/)")


def tw_child(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    meter = Meter(spec["db"])
    if spec["phase"] != "setup":
        meter.install()  # before Django opens any connection
    import django

    django.setup()
    import importlib.metadata as md

    from django.contrib.auth import get_user_model
    from django.db import close_old_connections, connection, connections

    if spec["phase"] == "setup":
        return tw_setup(get_user_model())

    from approvals import agents, services
    from approvals.models import ApprovalRequest, Run, ToolExecution

    (Worker,) = _tw_import(["approvals.worker", "approvals.execution.worker"], ["Worker"])
    from toolnexus import create_in_process_client
    from toolnexus.relay import relay_tool

    try:
        (flush_pushes,) = _tw_import(["approvals.broadcast", "approvals.live.publisher"], ["flush"])
    except ImportError:
        flush_pushes = None
    if inspect.iscoroutinefunction(flush_pushes):
        # The live-push lanes of old were threads to wait for; now a worker loop sends its
        # pushes on its own loop and settles them before `run_forever` returns.
        flush_pushes = None

    if spec["agent"] == "bench":

        def generate(request: Any) -> dict[str, Any]:
            text, calls = fake_model(request.messages)
            return {
                "content": text,
                "tool_calls": [{"id": c, "name": n, "arguments": a} for c, n, a in calls],
                "usage": {"prompt_tokens": 40, "completion_tokens": 12},
            }

        agents.register(
            TW_AGENT,
            model=lambda: create_in_process_client(generate=generate, model="bench-fake"),
            tools=lambda: [
                relay_tool("refund", "Refund an order (after approval).", REFUND_SCHEMA)
            ],
            executors={"refund": issue_refund},
            system_prompt=SYSTEM_PROMPT,
            description="vs_langgraph bench: the same fake model as the LangGraph side",
            replace=True,
        )
        agent = TW_AGENT
    else:
        agent = "demo"

    class BenchWorker(Worker):
        """The production loop (`run_forever`), stopped once the phase's tasks have run."""

        target: int | None = None
        phase_ran = 0
        done_check: Any = None

        last_done = 0.0

        def run_task(self, row: Any) -> None:
            super().run_task(row)
            self.last_done = time.monotonic()
            self.phase_ran += 1
            if self.target is not None and self.phase_ran >= self.target:
                self.stop.set()

        def run_once(self) -> bool:  # the worker of before the stock django-tasks-db one
            ran = super().run_once()
            if not ran and self.done_check is not None and self.done_check():
                self.stop.set()
            return ran

    worker = BenchWorker()
    timed_out = threading.Event()

    def staged(stage: str, fn: Any, *args: Any) -> Any:
        """Run fn on the main thread, its statements and CPU booked under `stage`."""
        meter.stage, c0 = stage, time.thread_time()
        try:
            return fn(*args)
        finally:
            if meter.active:
                meter.stage_cpu[stage] += time.thread_time() - c0
            meter.stage = "main"

    def work(target: int | None, done_check: Any) -> None:
        before = set(threading.enumerate())
        worker.target, worker.phase_ran, worker.done_check = target, 0, done_check
        worker.stop.clear()
        dog = threading.Timer(spec["timeout"], lambda: (timed_out.set(), worker.stop.set()))
        dog.daemon = True
        dog.start()
        watching = threading.Event()
        if done_check is not None and not hasattr(Worker, "run_once"):
            # The stock-based worker has no per-poll hook: a watcher stops it once done.
            # It asks the database only while the worker makes no progress, and the meter
            # does not count its statements.
            def watch() -> None:
                seen = -1
                while not watching.wait(0.05):
                    if worker.ran != seen:
                        seen = worker.ran
                        continue
                    if done_check():
                        worker.stop.set()
                        break
                connections.close_all()

            threading.Thread(target=watch, name="bench-done-watch", daemon=True).start()
        try:
            worker.run_forever()
        finally:
            watching.set()
            dog.cancel()
        if timed_out.is_set():
            raise RuntimeError(f"the worker loop did not finish within {spec['timeout']} s")
        worker.__dict__["_spawned"] = [t for t in threading.enumerate() if t not in before]

    def join_loop_threads() -> None:
        # run_forever's heartbeat and task-listener threads end once `stop` is set.
        for t in worker.__dict__.get("_spawned", []):
            if t.name.startswith(("heartbeat-", "task-listener-")):
                t.join(5)

    def quiesce() -> None:
        """Close every connection of this process (all threads)."""
        join_loop_threads()
        if flush_pushes is not None:
            flush_pushes(30)
        close_old_connections()
        connections.close_all()
        if getattr(connection, "pool", None) is not None:
            connection.close_pool()

    user = get_user_model().objects.get(username=REVIEWER)
    user.has_perm(DECIDE_PERMISSION)  # a reviewer's permissions, loaded once

    def halt(labels: list[int], *, via_loop: bool = True) -> list[int]:
        def start_all() -> list[int]:
            return [
                services.run_start(agent=agent, prompt=prompt_for(label), started_by=user).pk
                for label in labels
            ]

        ids = staged(SERVICES, start_all)
        if via_loop:
            staged(LOOP, work, len(ids), None)
        else:
            Worker(maintenance_every=0).drain(max_tasks=len(ids) + 10)
        return ids

    def to_end(labels: list[int]) -> list[int]:
        """The `rule` phase: N runs started, then the worker loop until all N are done (the
        rule decides each refund where the run would halt: one task per run)."""

        def start_all() -> list[int]:
            return [
                services.run_start(agent=agent, prompt=prompt_for(label), started_by=user).pk
                for label in labels
            ]

        ids = staged(SERVICES, start_all)
        staged(LOOP, work, len(ids), all_done(ids))
        return ids

    def rule_switch(on: bool) -> None:
        """The rule of the `rule` phase, on for that phase's process only (outside the
        clock): switched on, every other phase's step would read it and try it."""
        from approvals.models import Rule

        if not on:
            Rule.objects.filter(name=RULE_NAME).update(enabled=False)
            return
        Rule.objects.update_or_create(
            name=RULE_NAME,
            defaults={
                "agent": agent,
                "tool": "refund",
                "effect": Rule.Effect.APPROVE,
                "condition": RULE_CONDITION,
                "enabled": True,
            },
        )

    def pending_requests(run_ids: list[int]) -> list[str]:
        rows = dict(
            ApprovalRequest.objects.filter(run_id__in=run_ids, state="pending").values_list(
                "run_id", "request_id"
            )
        )
        missing = [r for r in run_ids if r not in rows]
        if missing:
            raise AssertionError(f"{len(missing)} run(s) have no pending request: {missing[:5]}")
        return [rows[r] for r in run_ids]

    def decide(request_ids: list[str]) -> None:
        for rid in request_ids:
            if spec["decision"] == "approve":
                services.request_approve(request_id=rid, user=user)
            else:
                services.request_decline(request_id=rid, user=user, reason=DECLINE_REASON)

    def all_done(run_ids: list[int]) -> Any:
        return lambda: Run.objects.filter(pk__in=run_ids, status="done").count() == len(run_ids)

    phase = spec["phase"]
    own_runs = phase in ("halt", "rule")  # phases that start their runs (the others resume)
    if phase == "rule":
        rule_switch(True)
    # -- warm-up (its runs were halted for it beforehand; a halt phase halts its own) --------
    if phase == "halt":
        halt(spec["warm"])
    elif phase == "rule":
        to_end(spec["warm"])
    else:
        decide(pending_requests(spec["warm"]))
        work(len(spec["warm"]), all_done(spec["warm"]))
    requests = pending_requests(spec["timed"]) if not own_runs else []
    quiesce()
    xact0, settled0 = meter.settled_xacts() if spec["measure"] else (0, True)
    connection.ensure_connection()  # open (the pool) before the clock starts
    _wait_go(spec["sync"])
    spy = None
    if spec.get("profile"):
        cpu_breakdown = _cpu_breakdown()
        cpu_breakdown.allow_sampling_by_children()
        spy = cpu_breakdown.start(os.getpid(), Path(spec["profile"]))
    meter.start()
    try:
        if phase == "halt":
            ids = halt(spec["timed"])
        elif phase == "rule":
            ids = to_end(spec["timed"])
        else:
            ids = spec["timed"]
            staged(SERVICES, decide, requests)
            if spec["sync"]:  # two processes share the queue: stop when every run is done
                staged(LOOP, work, None, all_done(spec["all_timed"]))
            else:
                staged(LOOP, work, len(ids), all_done(ids))
        t_last = worker.last_done
        f0 = time.monotonic()
        if flush_pushes is not None:
            flush_pushes(60)  # a sync flush (older versions): their pushes are part of the work
        flushing = time.monotonic() - f0
        m = meter.stop()
    finally:
        if spy is not None:
            cpu_breakdown.stop(spy)
    # With two processes, a process whose work is done notices that the other's is too only
    # at its next idle poll (up to 0.2 s later): the phase ends when the last resume did.
    m["t_done"] = t_last + flushing
    quiesce()
    if spec["measure"]:
        xact1, settled1 = meter.settled_xacts()
        m["xacts"] = xact1 - xact0
        m["settled"] = settled0 and settled1
    m["n"] = len(spec["timed"])

    # -- checks (after the measurement) ------------------------------------------------------
    if phase == "halt":
        pending_requests(ids)
        bad = Run.objects.filter(pk__in=ids).exclude(status="pending").count()
        if bad:
            raise AssertionError(f"{bad} run(s) not pending after the halt phase")
        m["checks"] = "every run pending on one request"
        m["ids"] = dict(zip(map(str, spec["timed"]), ids, strict=True))
        prep = halt(spec["prep"], via_loop=False)
        m["ids"].update(zip(map(str, spec["prep"]), prep, strict=True))
        if Run.objects.filter(pk__in=prep).exclude(status="pending").exists():
            raise AssertionError("a prepared run did not halt")
    elif phase == "rule":
        rule_switch(False)
        runs = list(Run.objects.filter(pk__in=ids).values_list("status", "text"))
        wrong = [(s, t[:80]) for s, t in runs if s != "done" or "refund issued" not in t]
        if wrong or len(runs) != len(ids):
            raise AssertionError(f"{len(wrong)} run(s) did not end as expected: {wrong[:3]}")
        asked = ApprovalRequest.objects.filter(run_id__in=ids)
        by_rule = asked.filter(decided_by_rule__isnull=False, state="approved").count()
        if asked.count() != len(ids) or by_rule != len(ids):
            raise AssertionError(
                f"{asked.count()} request(s), {by_rule} approved by the rule; {len(ids)} expected"
            )
        executions = ToolExecution.objects.filter(run_id__in=ids).count()
        if executions != len(ids):
            raise AssertionError(f"{executions} executor run(s) recorded, expected {len(ids)}")
        m["checks"] = (
            "every run done with the executor's output, its one request approved by the rule "
            f"(none pending); executor ran {executions}x"
        )
    else:
        mine = spec["all_timed"] if spec["sync"] else ids
        runs = list(Run.objects.filter(pk__in=ids).values_list("status", "text"))
        want = "refund issued" if spec["decision"] == "approve" else DECLINE_REASON
        wrong = [(s, t[:80]) for s, t in runs if s != "done" or want not in t]
        if wrong or len(runs) != len(ids):
            raise AssertionError(f"{len(wrong)} run(s) did not end as expected: {wrong[:3]}")
        executions = ToolExecution.objects.filter(run_id__in=ids).count()
        expected = len(ids) if spec["decision"] == "approve" else 0
        if executions != expected:
            raise AssertionError(f"{executions} executor run(s) recorded, expected {expected}")
        m["checks"] = (
            f"every run done with the expected text; executor ran {executions}x "
            f"(once per approved run); {len(mine)} run(s) in the phase"
        )
    m["versions"] = {
        d: md.version(d) for d in ("django", "psycopg", "psycopg-pool", "django-tasks-db")
    }
    m["pool"] = getattr(connection, "pool", None) is not None
    if flush_pushes is None:
        m["checks"] += " (live pushes sent before the worker loop returned)"
    connections.close_all()
    return m


def tw_setup(User: Any) -> dict[str, Any]:
    from django.contrib.auth.models import Permission

    try:
        (ensure_groups,) = _tw_import(
            ["approvals.accounts", "approvals.permissions"], ["ensure_groups"]
        )
        group = ensure_groups()["Reviewers"]
        user, _ = User.objects.get_or_create(username=REVIEWER)
        user.groups.add(group)
    except ImportError:
        user, _ = User.objects.get_or_create(username=REVIEWER)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="approvals",
                codename__in=[
                    "decide_request",
                    "add_run",
                    "view_run",
                    "view_approvalrequest",
                ],
            )
        )
    user = User.objects.get(pk=user.pk)
    if user.is_superuser or not user.has_perm(DECIDE_PERMISSION):
        raise AssertionError("the bench reviewer cannot decide requests")
    return {"user": user.username}


def run_child(system: str, spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    result = lg_child(spec) if system == LG else tw_child(spec)
    _emit(result)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: daemon threads (the push sends) hold nothing


# --------------------------------------------------------------------------------------- #
# Parent
# --------------------------------------------------------------------------------------- #


class BenchError(RuntimeError):
    pass


def admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
        conn.execute("SET statement_timeout = '120s'")
        conn.execute(sql)


def admin_query(sql: str, params: list[Any] | None = None) -> list[tuple]:
    import psycopg

    with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(sql, params).fetchall()


def check_db_name(name: str) -> str:
    if name in RESERVED_DB_NAMES or not re.fullmatch(r"bench_(lg|tw)_[0-9a-f]{8}", name):
        raise BenchError(f"refusing to use database name {name!r}")
    return name


def ensure_langgraph(venv: Path) -> tuple[str | None, str]:
    """(python of a venv with LangGraph + PostgresSaver at the pinned versions, "") or
    (None, why not). Reused when present."""
    py = venv / "bin" / "python"
    probe = (
        "import importlib.metadata as m; "
        "print(m.version('langgraph'), m.version('langgraph-checkpoint-postgres'))"
    )
    want = f"{LANGGRAPH_VERSION} {CHECKPOINT_POSTGRES_VERSION}"

    def installed() -> str | None:
        if not py.exists():
            return None
        r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, check=False)
        return r.stdout.strip() if r.returncode == 0 else None

    if installed() == want:
        return str(py), ""
    print(f"setting up {venv} (python -m venv + pip install langgraph=={LANGGRAPH_VERSION} ...)")
    try:
        if not py.exists():
            subprocess.run(
                [sys.executable, "-m", "venv", "--clear", str(venv)],
                check=True,
                capture_output=True,
                text=True,
            )
        pip = [
            str(py),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--retries",
            "1",
        ]
        pip += ["--timeout", "30", f"langgraph=={LANGGRAPH_VERSION}"]
        pip += [f"langgraph-checkpoint-postgres=={CHECKPOINT_POSTGRES_VERSION}"]
        pip += [f"psycopg[binary,pool]=={PSYCOPG_VERSION}"]
        r = subprocess.run(pip, capture_output=True, text=True, check=False, timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not create the venv: {exc}"
    if r.returncode != 0:
        tail = " / ".join(ln for ln in r.stderr.strip().splitlines()[-3:] if ln.strip())
        return None, f"pip could not install LangGraph: {tail}"
    if installed() != want:
        return None, f"LangGraph {want} not importable in {venv} after pip"
    return str(py), ""


class Child:
    """One child process: spec in a file, READY / GO on its pipes, RESULT on stdout."""

    def __init__(
        self,
        python: str,
        system: str,
        spec: dict[str, Any],
        env: dict[str, str],
        tmp: Path,
        tag: str,
    ) -> None:
        self.spec_path = tmp / f"{tag}.json"
        self.spec_path.write_text(json.dumps(spec))
        self.log_path = tmp / f"{tag}.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                python,
                str(Path(__file__).resolve()),
                "--child",
                system,
                str(self.spec_path),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            cwd=str(ROOT),
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.result: dict[str, Any] | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, mark: str, deadline: float) -> str:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"child timed out waiting for {mark.strip()}\n{self.tail()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=10)
                raise BenchError(
                    f"child exited ({self.proc.returncode}) before {mark.strip()}\n{self.tail()}"
                )
            if line.startswith(mark):
                return line[len(mark) :]

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("GO\n")
        self.proc.stdin.flush()

    def finish(self, deadline: float) -> dict[str, Any]:
        self.result = json.loads(self.wait_for(RESULT_MARK, deadline))
        try:
            self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
        self.log.close()
        return self.result

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join("    " + ln for ln in text.splitlines()[-lines:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


PHASES = [
    ("halt", "runs started until halted"),
    ("resume1", "resumes, 1 process"),
    ("resume2", "resumes, 2 processes"),
    ("decline", "decline + resume"),
    ("rule", "runs to done, rule / coded"),
]
# One process each: `--profile` samples these.
PROFILED = ("halt", "resume1", "decline", "rule")
# The `rule` phase pair: toolnexus-web's runs approved by a rule, LangGraph's approved in code.
PHASE_OF = {(LG, "rule"): "coded"}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="vs_langgraph-"))
        self.children: list[Child] = []
        self.created: list[str] = []
        self.suffix = secrets.token_hex(4)
        self.systems: dict[str, dict[str, Any]] = {}
        self.results: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self.label = 100000
        self.versions: dict[str, dict[str, str]] = {}

    # -- environment ---------------------------------------------------------------------

    def base_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "pythonpath")
            and not k.startswith(("DJANGO_", "TOOLNEXUS_", "DATABASE_", "REDIS_"))
        }
        env.update({"PYTHONUNBUFFERED": "1", "NO_PROXY": "127.0.0.1,localhost"})
        return env

    def tw_env(self, db: str) -> dict[str, str]:
        env = self.base_env()
        env.update(
            {
                "PYTHONPATH": str(ROOT),
                "DJANGO_SETTINGS_MODULE": "toolnexus_web.settings",
                "DJANGO_DEBUG": "0",
                "DJANGO_SECRET_KEY": "bench",
                "DATABASE_URL": f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{db}"
                "?application_name=bench_tw",
                "DATABASE_POOL": "1" if self.args.pool else "0",
                "DATABASE_PREPARED": "1" if self.args.prepared else "0",
                "DJANGO_STATIC_ROOT": str(self.tmp / "static"),
                "TOOLNEXUS_LOG_LEVEL": "WARNING",
            }
        )
        return env

    # -- set-up / tear-down ----------------------------------------------------------------

    def create_db(self, prefix: str) -> str:
        name = check_db_name(f"bench_{prefix}_{self.suffix}")
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return name

    def cleanup(self) -> None:
        for c in self.children:
            c.kill()
        for name in self.created:
            try:
                admin(f'DROP DATABASE IF EXISTS "{check_db_name(name)}" WITH (FORCE)')
            except Exception as exc:  # keep going: report it
                print(f"could not drop database {name}: {exc}", file=sys.stderr)
        self.created = []

    def setup(self) -> None:
        try:
            admin_query("SELECT 1")
        except Exception as exc:
            raise BenchError(
                f"PostgreSQL is not reachable at {PG_HOST}:{PG_PORT} as {PG_USER}: {exc}"
            ) from None
        self.pg_version = admin_query("SHOW server_version")[0][0]
        if not self.args.no_langgraph:
            py, why = ensure_langgraph(self.args.venv)
            if py is None:
                raise BenchError(f"LangGraph: {why} (use --no-langgraph to run ours alone)")
            db = self.create_db("lg")
            self.systems[LG] = {"python": py, "db": db, "env": self.base_env()}
            res = self.run_one(LG, {"phase": "setup", "db": db}, "lg-setup")
            self.versions[LG] = res["versions"]
        db = self.create_db("tw")
        env = self.tw_env(db)
        self.systems[TW] = {"python": sys.executable, "db": db, "env": env}
        for cmd in (
            ["migrate", "--noinput", "-v", "0"],
            ["collectstatic", "--noinput", "-v", "0"],
        ):
            r = subprocess.run(
                [sys.executable, str(ROOT / "manage.py"), *cmd],
                env=env,
                cwd=str(ROOT),
                capture_output=True,
                text=True,
                check=False,
            )
            if r.returncode != 0:
                raise BenchError(f"manage.py {cmd[0]} failed:\n{r.stderr[-3000:]}")
        self.run_one(TW, {"phase": "setup", "db": db}, "tw-setup")
        for system in self.systems:
            self.results[system] = {p: [] for p, _ in PHASES}
        self.phases = [(p, label) for p, label in PHASES if not self.args.rule_only or p == "rule"]

    # -- children --------------------------------------------------------------------------

    def spawn(self, system: str, spec: dict[str, Any], tag: str) -> Child:
        s = self.systems[system]
        spec = {
            "db": s["db"],
            "agent": self.args.tw_agent,
            "timeout": self.timeout(),
            **spec,
        }
        child = Child(s["python"], system, spec, s["env"], self.tmp, tag)
        self.children.append(child)
        return child

    def timeout(self) -> float:
        return 300.0 + 1.5 * (self.args.runs + 4 * self.args.warmup)

    def run_one(self, system: str, spec: dict[str, Any], tag: str) -> dict[str, Any]:
        spec = {"sync": False, "measure": False, "warm": [], "timed": [], **spec}
        child = self.spawn(system, spec, tag)
        deadline = time.monotonic() + 3 * self.timeout()
        try:
            return child.finish(deadline)
        except BenchError:
            child.kill()
            raise

    def labels(self, n: int) -> list[int]:
        out = list(range(self.label, self.label + n))
        self.label += n
        return out

    def plan_round(self) -> dict[str, list[int]]:
        n, w = self.args.runs, self.args.warmup
        return {
            "halt_warm": self.labels(w),
            "halt": self.labels(n),
            "resume1_warm": self.labels(w),
            "resume2_warm_a": self.labels(w),
            "resume2_warm_b": self.labels(w),
            "resume2": self.labels(n),
            "decline_warm": self.labels(w),
            "decline": self.labels(n),
            "rule_warm": self.labels(w),
            "rule": self.labels(n),
        }

    def phase(
        self,
        system: str,
        phase: str,
        plan: dict[str, list[int]],
        ids: dict[str, Any],
        rnd: int,
    ) -> dict[str, Any]:
        tag = f"r{rnd}-{phase}-{'lg' if system == LG else 'tw'}"
        pick = lambda key: [ids[str(label)] for label in plan[key]]  # noqa: E731
        profile: dict[str, str] = {}
        if self.args.profile and system == TW and phase in PROFILED:
            self.args.profile.mkdir(parents=True, exist_ok=True)
            out = self.args.profile.resolve() / f"{tag}.txt"
            out.unlink(missing_ok=True)  # an earlier run's samples are not this one's
            profile = {"profile": str(out)}
        if phase == "halt":
            prep = [
                label for key in plan if key not in ("halt_warm", "halt") for label in plan[key]
            ]
            spec = {
                "phase": "halt",
                "warm": plan["halt_warm"],
                "timed": plan["halt"],
                "prep": prep,
                "measure": True,
                **profile,
            }
            res = self.run_one(system, spec, tag)
            ids.update(res.pop("ids"))
            return {**res, **profile}
        if phase == "rule":
            spec = {
                "phase": PHASE_OF.get((system, phase), phase),
                "warm": plan["rule_warm"],
                "timed": plan["rule"],
                "measure": True,
                **profile,
            }
            return {**self.run_one(system, spec, tag), **profile}
        if phase in ("resume1", "decline"):
            warm_key = "resume1_warm" if phase == "resume1" else "decline_warm"
            timed_key = "halt" if phase == "resume1" else "decline"
            spec = {
                "phase": phase,
                "warm": pick(warm_key),
                "timed": pick(timed_key),
                "decision": "approve" if phase == "resume1" else "decline",
                "measure": True,
                **profile,
            }
            return {**self.run_one(system, spec, tag), **profile}
        # resume2: two processes, each deciding/resuming half, started together
        timed = pick("resume2")
        half = len(timed) // 2
        parts = [
            (pick("resume2_warm_a"), timed[:half]),
            (pick("resume2_warm_b"), timed[half:]),
        ]
        kids = [
            self.spawn(
                system,
                {
                    "phase": "resume2",
                    "warm": warm,
                    "timed": mine,
                    "all_timed": timed,
                    "decision": "approve",
                    "sync": True,
                    "measure": False,
                },
                f"{tag}-{i}",
            )
            for i, (warm, mine) in enumerate(parts)
        ]
        deadline = time.monotonic() + 3 * self.timeout()
        try:
            for k in kids:
                k.wait_for(READY_MARK, deadline)
            for k in kids:
                k.go()
            outs = [k.finish(deadline) for k in kids]
        except BenchError:
            for k in kids:
                k.kill()
            raise
        return {
            "t0": min(o["t0"] for o in outs),
            "t1": max(o.get("t_done", o["t1"]) for o in outs),
            "n": len(timed),
            "cpu_proc": sum(o["cpu_proc"] for o in outs),
            "checks": outs[0]["checks"],
            "versions": outs[0].get("versions"),
            "pool": outs[0].get("pool"),
        }

    def run(self) -> None:
        systems = list(self.systems)
        for rnd in range(self.args.rounds):
            plans = {s: self.plan_round() for s in systems}
            ids: dict[str, dict[str, Any]] = {s: {} for s in systems}
            for pi, (phase, label) in enumerate(self.phases):
                order = systems if (rnd + pi) % 2 == 0 else list(reversed(systems))
                for system in order:
                    t = time.monotonic()
                    res = self.phase(system, phase, plans[system], ids[system], rnd)
                    res["rate"] = res["n"] / (res["t1"] - res["t0"])
                    self.results[system][phase].append(res)
                    if system == TW and res.get("versions"):
                        self.versions[TW] = res["versions"]
                        self.tw_pool = res.get("pool")
                    extra = ""
                    if "xacts" in res:
                        per = res["n"]
                        extra = (
                            f"  cpu {1000 * res['cpu_proc'] / per:.1f}+"
                            f"{1000 * res['cpu_pg'] / per:.1f} ms/op, "
                            f"{res['statements'] / per:.1f} stmt, {res['xacts'] / per:.1f} xact"
                        )
                    if "load" in res:
                        extra += f", load {res['load'][1]:.1f}"
                    print(
                        f"  round {rnd + 1}/{self.args.rounds}  {label:<26} {system:<14}"
                        f"{res['rate']:8.1f}/s{extra}  ({time.monotonic() - t:.0f} s)",
                        flush=True,
                    )

    # -- report ------------------------------------------------------------------------------

    def report(self) -> None:
        a = self.args
        lg, tw = self.results.get(LG), self.results[TW]

        def med(xs: list[float]) -> float:
            return statistics.median(xs) if xs else float("nan")

        def rates(res: dict[str, list[dict[str, Any]]] | None, phase: str) -> list[float]:
            return [r["rate"] for r in res[phase]] if res else []

        def per_op(
            res: dict[str, list[dict[str, Any]]] | None, phase: str, key: str
        ) -> list[float]:
            if not res:
                return []
            scale = 1000.0 if key.startswith("cpu") else 1.0
            return [scale * r[key] / r["n"] for r in res[phase] if key in r]

        print()
        print(
            f"toolnexus-web vs LangGraph: N = {a.runs} runs per phase, {a.rounds} round(s) "
            f"interleaved, {a.warmup} warm-up operations per process, fresh processes per phase"
        )
        print(
            "Figures: median over rounds; ratio: median over rounds of toolnexus-web / LangGraph."
        )
        print()
        head = (
            f"{'per second unless said':<52} {'LangGraph':>12} {'toolnexus-web':>14} {'ratio':>7}"
        )
        print(head)
        print("-" * len(head))

        def ratio(xs: list[float], ys: list[float]) -> str:
            if not xs or not ys:
                return "n/a"
            return f"{med([y / x for x, y in zip(xs, ys, strict=False)]):.2f}"

        ran = [phase for phase, _ in self.phases]
        for phase, label in self.phases:
            x, y = rates(lg, phase), rates(tw, phase)
            xs = f"{med(x):.1f}" if x else "-"
            print(f"{label:<52} {xs:>12} {med(y):>14.1f} {ratio(x, y):>7}")

        def cpu(res: Any, phase: str) -> list[float]:
            procs, pgs = per_op(res, phase, "cpu_proc"), per_op(res, phase, "cpu_pg")
            return [p + g for p, g in zip(procs, pgs, strict=False)]

        def cpu_cell(res: Any, phase: str) -> str:
            if not res:
                return "-"
            return (
                f"{med(per_op(res, phase, 'cpu_proc')):.1f} + "
                f"{med(per_op(res, phase, 'cpu_pg')):.1f}"
            )

        def st_cell(res: Any, phase: str) -> str:
            if not res:
                return "-"
            return (
                f"{med(per_op(res, phase, 'statements')):.1f} / "
                f"{med(per_op(res, phase, 'xacts')):.1f}"
            )

        for phase, what in (("resume1", "resume"), ("rule", "rule-decided run")):
            if phase not in ran:
                continue
            r = ratio(cpu(lg, phase), cpu(tw, phase))
            print(
                f"{'CPU ms per ' + what + ' (process + PostgreSQL backends)':<52} "
                f"{cpu_cell(lg, phase):>12} {cpu_cell(tw, phase):>14} "
                f"{r + 'x' if r != 'n/a' else r:>7}"
            )
            print(
                f"{'statements / transactions per ' + what:<52} {st_cell(lg, phase):>12} "
                f"{st_cell(tw, phase):>14}"
            )
        if "rule" in ran and lg:
            each = [t / c for c, t in zip(rates(lg, "rule"), rates(tw, "rule"), strict=False)]
            verdict = "met" if med(each) >= 1.0 else "missed"
            print(
                f"runs to done, a rule (toolnexus-web) / code (LangGraph) approving: median "
                f"{med(each):.2f} (rounds: {', '.join(f'{v:.2f}' for v in each)}); "
                f"goal >= 1.0 {verdict}"
            )
        print()

        print("Per round (ops/s):")
        for phase, label in self.phases:
            for system, res in ((LG, lg), (TW, tw)):
                if res:
                    each = ", ".join(f"{v:.1f}" for v in rates(res, phase))
                    print(f"  {label:<28} {system:<14} {each}")
        print()
        print(
            "Per operation, one process (median over rounds; rule: LangGraph's is `coded`, "
            "its approval decided in the tool node):"
        )
        hd = (
            f"  {'phase':<10} {'system':<14} {'CPU ms proc':>11} {'CPU ms pg':>10} "
            f"{'statements':>10} {'transactions':>12}  rounds (proc+pg ms)"
        )
        print(hd)
        for phase in ("halt", "resume1", "decline", "rule"):
            for system, res in ((LG, lg), (TW, tw)):
                if not res or not res[phase]:
                    continue
                procs, pgs = (
                    per_op(res, phase, "cpu_proc"),
                    per_op(res, phase, "cpu_pg"),
                )
                each = ", ".join(f"{p:.1f}+{g:.1f}" for p, g in zip(procs, pgs, strict=False))
                print(
                    f"  {phase:<10} {system:<14} {med(procs):>11.1f} {med(pgs):>10.1f} "
                    f"{med(per_op(res, phase, 'statements')):>10.1f} "
                    f"{med(per_op(res, phase, 'xacts')):>12.1f}  {each}"
                )
        print()
        print(
            "Wall against CPU per operation, one process, each round: wall ms (1000 / rate), "
            "CPU ms (process + PostgreSQL), waited ms (wall - CPU: the machine's other work, "
            "commits' flushes, hops between threads), the process's context switches "
            "(voluntary / involuntary):"
        )
        for phase in ("halt", "resume1", "decline", "rule"):
            for system, res in ((LG, lg), (TW, tw)):
                if not res or not res[phase]:
                    continue
                cells = []
                for r in res[phase]:
                    wall = 1000 / r["rate"]
                    cpu_ms = 1000 * (r["cpu_proc"] + r["cpu_pg"]) / r["n"]
                    vol, invol = (x / r["n"] for x in r.get("switches", [0, 0]))
                    cells.append(
                        f"{wall:.1f} = {cpu_ms:.1f} + {wall - cpu_ms:.1f} ({vol:.0f}/{invol:.0f})"
                    )
                print(f"  {phase:<10} {system:<14} " + ", ".join(cells))
        print()
        shown = [
            (p, w) for p, w in (("resume1", "resume"), ("rule", "rule-decided run")) if p in ran
        ]
        for phase, what in shown:
            print(f"Statements per {what} by kind (last round, 1 process):")
            for system, res in ((LG, lg), (TW, tw)):
                if res and res[phase]:
                    last = res[phase][-1]
                    kinds = sorted(last["kinds"].items(), key=lambda kv: -kv[1])
                    text = ", ".join(f"{k} {v / last['n']:.2f}" for k, v in kinds)
                    print(f"  {system:<14} {text}")
            print()
        for phase, what in shown:
            print(
                f"Per {what} by thread of the process (median over rounds, 1 process; main = "
                "the decisions and the worker loop, or LangGraph's invoke):"
            )
            self.report_threads(phase)
        unsettled = [
            f"{s} {p}"
            for s, res in self.results.items()
            for p in res
            for r in res[p]
            if r.get("settled") is False
        ]
        if unsettled:
            print(f"  note: a backend was still connected when counting transactions: {unsettled}")
        if a.profile:
            self.report_profile(tw, per_op)
        print()
        print("Checks (every phase, every round):")
        for system, res in self.results.items():
            for phase, label in PHASES:
                if res[phase]:
                    print(f"  {system:<14} {label:<28} {res[phase][-1]['checks']}")
        print()
        print("Settings:")
        print(
            f"  PostgreSQL {self.pg_version} at {PG_HOST}:{PG_PORT}; databases "
            f"{', '.join(s['db'] for s in self.systems.values())} (dropped at exit)"
        )
        print(
            f"  machine: {os.cpu_count()} CPU(s), python {platform.python_version()}, "
            f"load average at end {os.getloadavg()[0]:.2f}"
        )
        if LG in self.versions:
            v = self.versions[LG]
            print("  LangGraph venv: " + ", ".join(f"{k} {val}" for k, val in v.items()))
            print(
                "  LangGraph: StateGraph model -> tools (interrupt; `coded`: decided in the "
                "node, no interrupt) -> model, PostgresSaver.from_conn_string (one connection "
                "per process, autocommit, no pipeline), default durability (async), plain-dict "
                "messages"
            )
        tv = self.versions.get(TW, {})
        print(
            f"  toolnexus-web {git_describe()}: " + ", ".join(f"{k} {val}" for k, val in tv.items())
        )
        print(
            f"  toolnexus-web: DATABASE_POOL={'1' if a.pool else '0'} "
            f"DATABASE_PREPARED={'1' if a.prepared else '0'} "
            f"(pool {'on' if getattr(self, 'tw_pool', a.pool) else 'off'}), DJANGO_DEBUG=0, "
            f"REDIS_URL unset (in-memory channel layer), agent "
            f"{TW_AGENT if a.tw_agent == 'bench' else 'demo'}, worker loop = Worker.run_forever"
        )
        if any(p == "rule" for p, _ in self.phases):
            print(
                f"  rule / coded: toolnexus-web's rule {RULE_NAME!r} (approve refund for the "
                f"agent, condition {RULE_CONDITION!r}, on in that phase's process only); "
                f"LangGraph's tool node approves amount <= {POLICY_LIMIT} in code"
            )
        print(
            "  statements: counted in each process by wrapping psycopg Cursor.execute/"
            "executemany (pg_stat_statements is not preloaded on this server); transactions: "
            "pg_stat_database xact_commit + xact_rollback of the bench database"
        )

    def report_threads(self, phase: str) -> None:
        """Per operation of `phase` by thread group: statements and CPU (median over rounds)."""
        med = statistics.median
        for system in (LG, TW):
            res = self.results.get(system)
            if not res or not res[phase]:
                continue
            rows = res[phase]
            order = [SERVICES, LOOP, "main", "main: other", "live-push lanes", "other threads"]
            groups = sorted(
                {g for r in rows for g in (*r["by_thread"], *r["thread_cpu"])},
                key=lambda g: (order.index(g) if g in order else len(order), g),
            )
            cells = []
            for g in groups:
                st = med([r["by_thread"].get(g, 0) / r["n"] for r in rows])
                ms = med([1000 * r["thread_cpu"].get(g, 0.0) / r["n"] for r in rows])
                cells.append(f"{g}: {st:.1f} statements, {ms:.1f} ms CPU")
            gone = med(
                [1000 * (r["cpu_proc"] - sum(r["thread_cpu"].values())) / r["n"] for r in rows]
            )
            cells.append(f"threads that ended during the phase: {gone:.1f} ms CPU")
            print(f"  {system:<14} " + "; ".join(cells))

    def report_profile(self, tw: dict[str, list[dict[str, Any]]], per_op: Any) -> None:
        """Where toolnexus-web's process CPU per operation goes (`--profile`)."""
        cpu_breakdown = _cpu_breakdown()
        print()
        print(
            "Where toolnexus-web's process CPU per operation goes (--profile: py-spy --gil on "
            "the process, every round's samples; ms/op = share x the median process CPU per "
            "operation; sampling slows the profiled phases, so compare rates from a run "
            "without --profile):"
        )
        for phase, label in PHASES:
            if phase not in PROFILED or not tw[phase]:
                continue
            paths = [Path(r["profile"]) for r in tw[phase] if r.get("profile")]
            cpu = statistics.median(per_op(tw, phase, "cpu_proc"))
            print(f"  {label} (samples in {self.args.profile}):")
            for line in cpu_breakdown.table(cpu_breakdown.samples_by_part(paths), cpu):
                print(line)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": {k: str(v) for k, v in vars(self.args).items()},
            "versions": self.versions,
            "results": self.results,
        }


def _cpu_breakdown() -> Any:
    """bench/cpu_breakdown.py (`--profile`), importable from the parent and the children."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench import cpu_breakdown

    return cpu_breakdown


def machine_speed() -> float:
    """bench/inbox_scale.py's fixed Python loop, ms (lower is faster): other work on the
    host slows this machine by up to 2x for minutes at a time; printed before and after."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.inbox_scale import machine_speed as loop_ms

    return loop_ms()


def git_describe() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return f"{rev}{' (uncommitted changes)' if dirty else ''}"
    except OSError:
        return "(no git)"


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return run_child(argv[1], argv[2])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=500, help="N: runs per phase (default 500)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up operations per process")
    ap.add_argument("--quick", action="store_true", help="N=50, 1 round, 5 warm-ups: a smoke check")
    ap.add_argument("--no-langgraph", action="store_true", help="run toolnexus-web alone")
    ap.add_argument(
        "--rule-only",
        action="store_true",
        help="only the rule / coded phase pair (runs approved by a rule / in code)",
    )
    ap.add_argument(
        "--pool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="toolnexus-web with DATABASE_POOL=1 (default) or without",
    )
    ap.add_argument(
        "--prepared",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="toolnexus-web with DATABASE_PREPARED=1 (default: server-side binding, prepared"
        " statements) or binding on the client",
    )
    ap.add_argument(
        "--tw-agent",
        choices=["bench", "demo"],
        default="bench",
        help="toolnexus-web agent: the shared fake model (default) or the demo agent",
    )
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="LangGraph's bench venv")
    ap.add_argument("--json", type=Path, help="also write every round's figures here")
    ap.add_argument(
        "--profile",
        type=Path,
        help="py-spy (--gil) the toolnexus-web process of the one-process phases into this "
        "directory and print where its CPU per operation goes, by part of the path",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.rounds, args.warmup = 50, 1, 5
    if args.runs < 10 or args.rounds < 1 or args.warmup < 1:
        ap.error("--runs must be >= 10, --rounds >= 1, --warmup >= 1")
    if args.profile and _cpu_breakdown().py_spy() is None:
        ap.error("--profile needs py-spy: pip install py-spy (into the venv)")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    bench = Bench(args)
    t0 = time.monotonic()
    ok = False
    try:
        print(
            f"python {platform.python_version()}, {os.cpu_count()} CPU(s); "
            f"N={args.runs}, rounds={args.rounds}, warm-up={args.warmup}, "
            f"pool={'on' if args.pool else 'off'}, "
            f"prepared={'on' if args.prepared else 'off'}; "
            f"machine speed: a fixed Python loop takes {machine_speed():.0f} ms "
            f"(lower is faster)",
            flush=True,
        )
        bench.setup()
        bench.run()
        bench.report()
        print(f"  machine speed at the end: {machine_speed():.0f} ms")
        if args.json:
            args.json.write_text(json.dumps(bench.to_json(), indent=2) + "\n")
        ok = True
    except BenchError as exc:
        print(f"\nbench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        bench.cleanup()
        kept = "" if ok else f"; logs kept in {bench.tmp}"
        print(f"\n(total {time.monotonic() - t0:.0f} s; databases dropped{kept})")
        if ok:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
