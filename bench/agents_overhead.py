"""Agent runtime overhead: a two-level delegation, and single-agent runs against the base.

Against the loopback mock model of bench/mock_llm.py (the engine_overhead.py scenario: model
trip 1 asks for two tool calls, add and echo, trip 2 answers "results: 5 | hello"), each
request is one of:

  single@base     Client.run of one agent, the engine at the base commit (`--base`,
                  default: BASE, the engine before the runtime), exported with `git archive`
  single          the same on this tree's engine: the single-agent path's regression check
  runtime-single  Runtime.run of one agent with no team (the same 2 model trips)
  nested          a coordinator whose plain `task` tool runs a second Client.run by hand:
                  what a two-level delegation costs with no runtime (4 model trips)
  delegation      Runtime.run of a coordinator that delegates through `task` to a worker
                  (4 model trips: task call, worker's 2 trips, final text)

Each client runs in its own subprocess, one at a time, in an order rotated every round, and
every result is checked outside the timed region. The report gives each client's median
over rounds and the same-round ratios that matter: single / single@base (goal <= 1.10),
runtime-single / single, delegation / nested.

Usage:  python bench/agents_overhead.py [--requests 200] [--warmup 10] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import engine_overhead as eo

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DELEGATED = "delegated: " + eo.EXPECTED_TEXT
GOAL_SINGLE = 1.10
# The engine before the agent runtime was merged: a fixed base, so the single-agent check
# compares the runtime's changes to the loop with what came before, run from any branch
# (a merge-base with main is HEAD itself on main, comparing the engine with itself).
BASE = "4bb611e0fd8df0dccbbea9f69f368fb342452ec2"


def _tools(toolnexus: Any) -> list[Any]:
    def wrap(fn: Callable[..., str]) -> Callable[..., Any]:
        def execute(args: dict[str, Any], ctx: Any = None) -> Any:
            return toolnexus.ToolResult(output=fn(**args))

        return execute

    return [
        toolnexus.Tool(name=n, description=d, input_schema=s, source="native", execute=wrap(fn))
        for (n, d, s), fn in zip(eo.TOOL_SPECS, eo.TOOL_FUNCS.values(), strict=True)
    ]


def inprocess_model(req: Any) -> dict[str, Any]:
    """bench/mock_llm.py's answers, as an in-process `generate` (no socket, no JSON)."""
    outputs = [str(m.get("content")) for m in req.messages if m.get("role") == "tool"]
    if any((t.get("function") or {}).get("name") == "task" for t in req.tools or []):
        if outputs:
            return {"content": "delegated: " + outputs[-1]}
        prompt = next(m["content"] for m in reversed(req.messages) if m.get("role") == "user")
        call = {
            "id": "call_task_1",
            "name": "task",
            "arguments": {"agent": "worker", "prompt": prompt},
        }
        return {"tool_calls": [call]}
    if outputs:
        return {"content": "results: " + " | ".join(outputs)}
    return {
        "tool_calls": [
            {"id": "call_add_1", "name": "add", "arguments": {"a": 2, "b": 3}},
            {"id": "call_echo_2", "name": "echo", "arguments": {"text": "hello"}},
        ]
    }


async def _measure(
    once: Callable[[], Any], check: Callable[[Any], None], n: int, warmup: int
) -> dict[str, list[float]]:
    """Wall time and this process's CPU time per request (the mock model's CPU is not in
    it: another process over HTTP, the trivial function above in process)."""
    for _ in range(warmup):
        check(await once())
    gc.collect()
    wall: list[float] = []
    cpu: list[float] = []
    clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
    for _ in range(n):
        t0, c0 = clock(), cpu_clock()
        out = await once()
        cpu.append((cpu_clock() - c0) / 1e6)
        wall.append((clock() - t0) / 1e6)
        check(out)
    return {"wall": wall, "cpu": cpu}


def _check_single(result: Any) -> None:
    eo._check_run(result)


def _check_delegated(result: Any) -> None:
    if result.status != "done" or result.text != DELEGATED:
        raise AssertionError(f"unexpected delegation result {result.status!r} {result.text!r}")


async def _worker(name: str, engine_dir: str, base_url: str, n: int, warmup: int):
    sys.path.insert(0, engine_dir)
    import toolnexus

    if base_url == "inprocess":
        client = toolnexus.create_in_process_client(generate=inprocess_model, model=eo.MODEL)
    else:
        client = toolnexus.create_client(
            base_url=base_url, style="openai", model=eo.MODEL, api_key="k", max_turns=10
        )
    tools = _tools(toolnexus)
    try:
        async with await toolnexus.create_toolkit(builtins=False, extra_tools=tools) as tk:
            if name in ("single", "single@base"):
                samples = await _measure(
                    lambda: client.run(eo.PROMPT, tk), _check_single, n, warmup
                )
            elif name == "runtime-single":
                rt_agents = [toolnexus.Agent(name="solo", system_prompt="You add and echo.")]

                async def once() -> Any:
                    # A runtime per request, as a host makes one per run.
                    rt = toolnexus.Runtime(rt_agents, client=client, toolkit=tk)
                    return await rt.run("solo", eo.PROMPT)

                def check(result: Any) -> None:
                    if result.status != "done" or result.text != eo.EXPECTED_TEXT:
                        raise AssertionError(f"unexpected {result.status!r} {result.text!r}")
                    if result.turns != 2 or result.tool_calls != 2:
                        raise AssertionError(f"turns={result.turns} calls={result.tool_calls}")

                samples = await _measure(once, check, n, warmup)
            elif name == "nested":
                worker = toolnexus.Client(
                    backend=client.backend, model=eo.MODEL, system_prompt="You add and echo."
                )

                async def task(args: dict[str, Any], ctx: Any = None) -> Any:
                    done = await worker.run(args["prompt"], tk)
                    return toolnexus.ToolResult(output=done.text)

                schema = {
                    "type": "object",
                    "properties": {"agent": {"type": "string"}, "prompt": {"type": "string"}},
                }
                task_tool = toolnexus.Tool("task", "delegate", schema, execute=task)
                coordinator = toolnexus.Client(
                    backend=client.backend, model=eo.MODEL, system_prompt="You delegate."
                )
                top_kit = toolnexus.Toolkit([task_tool])
                samples = await _measure(
                    lambda: coordinator.run(eo.PROMPT, top_kit), _check_delegated, n, warmup
                )
            elif name == "delegation":
                rt_agents = [
                    toolnexus.Agent(
                        name="coordinator", system_prompt="You delegate.", tools=[], team=["worker"]
                    ),
                    toolnexus.Agent(
                        name="worker", system_prompt="You add and echo.", description="adds"
                    ),
                ]

                async def once() -> Any:
                    rt = toolnexus.Runtime(rt_agents, client=client, toolkit=tk)
                    return await rt.run("coordinator", eo.PROMPT)

                def check(result: Any) -> None:
                    _check_delegated(result)
                    if result.tool_calls != 3 or len(result.messages) < 4:
                        raise AssertionError(f"tool_calls={result.tool_calls}")

                samples = await _measure(once, check, n, warmup)
            else:
                raise SystemExit(f"unknown worker {name}")
    finally:
        await client.aclose()
    return samples, {"library": f"toolnexus from {engine_dir}", "python": platform.python_version()}


CLIENTS = ["single@base", "single", "runtime-single", "nested", "delegation"]


def export_base(ref: str, into: Path) -> str:
    """`toolnexus/` at `ref`, written under `into` (read from git; no worktree is touched)."""
    sha = subprocess.run(
        ["git", "-C", str(REPO_DIR), "rev-parse", "--short", ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    archive = into / "base.tar"
    subprocess.run(
        ["git", "-C", str(REPO_DIR), "archive", "-o", str(archive), ref, "toolnexus"], check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return sha


def measure(name: str, engine_dir: str, base_url: str, args: argparse.Namespace) -> dict:
    """One client, one round, in its own process: wall p50/p95/mean and CPU mean/p50."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name]
    cmd += ["--engine-dir", engine_dir, "--base-url", base_url]
    cmd += ["--requests", str(args.requests), "--warmup", str(args.warmup)]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(eo.RESULT_MARK)]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed:\n{r.stderr[-4000:] or r.stdout[-4000:]}")
    samples = json.loads(lines[-1][len(eo.RESULT_MARK) :])["samples_ms"]
    out = eo.summarize(samples["wall"])
    cpu = eo.summarize(samples["cpu"])
    out["cpu"], out["cpu_p50"] = cpu["mean"], cpu["p50"]
    return out


def report(rounds: dict[str, list[dict[str, float]]], args: argparse.Namespace, base: str) -> None:
    med = eo._med

    def ratio(a: str, b: str, key: str) -> list[float]:
        return [x[key] / y[key] for x, y in zip(rounds[a], rounds[b], strict=True)]

    print()
    print(
        f"Per request ({args.model} model), {args.requests} requests after {args.warmup} "
        f"warm-ups, {args.rounds} rounds alternating; medians over rounds. Base: {base}."
    )
    print("Wall: p50, p95, mean and [p50 min-max]; cpu: this process's CPU per request (mean).")
    head = (
        f"{'client':<16} {'trips':>5} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8} "
        f"{'cpu ms':>8}  p50 range"
    )
    print(head)
    print("-" * len(head))
    trips = {"nested": 4, "delegation": 4}
    for name in CLIENTS:
        rs = rounds[name]
        p50, p95, mean, cpu = (med([r[k] for r in rs]) for k in ("p50", "p95", "mean", "cpu"))
        rng = f"[{min(r['p50'] for r in rs):.3f}-{max(r['p50'] for r in rs):.3f}]"
        print(
            f"{name:<16} {trips.get(name, 2):>5} {p50:8.3f} {p95:8.3f} {mean:8.3f} "
            f"{cpu:8.3f}  {rng}"
        )
    print()
    print("Same-round ratios, median over rounds:")
    for label, a, b, goal in (
        ("single / single@base", "single", "single@base", GOAL_SINGLE),
        ("runtime-single / single", "runtime-single", "single", None),
        ("delegation / nested", "delegation", "nested", None),
        ("delegation / single", "delegation", "single", None),
    ):
        for key in ("p50", "cpu"):
            rs = ratio(a, b, key)
            verdict = "" if goal is None else ("  OK" if med(rs) <= goal else "  MISSED")
            goal_text = "" if goal is None else f" (goal <= {goal:.2f})"
            each = ", ".join(f"{x:.3f}" for x in rs)
            print(f"{label + ' ' + key:<30} {med(rs):.3f}{goal_text}{verdict}   rounds: {each}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--base",
        default=BASE,
        help=f"git ref of the base engine (default: {BASE[:7]}, the engine before the runtime)",
    )
    ap.add_argument(
        "--model",
        choices=["inprocess", "http"],
        default="inprocess",
        help="the model: an in-process function (default: engine CPU only) or the "
        "loopback mock of mock_llm.py (HTTP included)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--engine-dir", help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        samples, info = asyncio.run(
            _worker(args.worker, args.engine_dir, args.base_url, args.requests, args.warmup)
        )
        print(eo.RESULT_MARK + json.dumps({"samples_ms": samples, "info": info}), flush=True)
        return 0

    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPU(s); "
        "mock model and each client in separate processes, loopback only"
    )
    with tempfile.TemporaryDirectory() as tmp:
        base = export_base(args.base, Path(tmp))
        dirs = {name: str(REPO_DIR) for name in CLIENTS}
        dirs["single@base"] = tmp
        mock = None
        base_url = "inprocess"
        if args.model == "http":
            mock, port = eo.start_mock()
            base_url = f"http://127.0.0.1:{port}/v1"
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in CLIENTS}
        try:
            for rnd in range(args.rounds):
                order = CLIENTS[rnd % len(CLIENTS) :] + CLIENTS[: rnd % len(CLIENTS)]
                for name in order:
                    t0 = time.monotonic()
                    rounds[name].append(measure(name, dirs[name], base_url, args))
                    print(
                        f"  round {rnd + 1}/{args.rounds}  {name:<16} "
                        f"p50 {rounds[name][-1]['p50']:.3f} ms  ({time.monotonic() - t0:.1f} s)",
                        flush=True,
                    )
        finally:
            if mock is not None:
                mock.terminate()
                mock.wait(timeout=5)
    report(rounds, args, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
