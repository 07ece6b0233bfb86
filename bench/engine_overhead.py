"""Engine overhead benchmark: per-request framework cost against a local mock model.

One request = the agent loop answering one prompt against the OpenAI-compatible mock in
bench/mock_llm.py on loopback: model trip 1 returns two parallel tool calls (add, echo),
both tools run (plain Python functions), model trip 2 returns the final text.

Clients, measured side by side in one run, each in its own subprocess (the mock runs in
another one):

  http.client     stdlib keep-alive connection, the two POSTs only      (context)
  httpx-sync      httpx.Client, the two POSTs only                      (context)
  httpx-async     httpx.AsyncClient, the two POSTs only                 (the floor)
  httpx-async-aiohttp  the same over httpx-aiohttp's AiohttpTransport  (context)
  published       toolnexus 0.21.0 from PyPI, in bench/.venvs/toolnexus-0.21.0
  ours            toolnexus from this repository

Usage:  python bench/engine_overhead.py [--requests 100] [--warmup 5] [--rounds 3]
See bench/README.md for what it prints.

The same file is also the worker: `--worker CLIENT` measures one client against an
already running mock and prints one "BENCH_RESULT {json}" line. The worker imports only
the stdlib at module level, so the published package's venv python can run it too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
PUBLISHED_VERSION = "0.21.0"
DEFAULT_VENV = BENCH_DIR / ".venvs" / f"toolnexus-{PUBLISHED_VERSION}"

MODEL = "mock-model"
PROMPT = "Add 2 and 3, and echo hello."
EXPECTED_TEXT = "results: 5 | hello"  # what bench/mock_llm.py answers once both tools ran
RESULT_MARK = "BENCH_RESULT "
SKIP_MARK = "BENCH_SKIP "
EXIT_SKIP = 3  # worker exit code: client not available (not an error of the harness)


# --------------------------------------------------------------------------- #
# The scenario's tools: plain Python functions, wrapped per framework below.
# --------------------------------------------------------------------------- #


def tool_add(a: float, b: float) -> str:
    total = a + b
    return str(int(total)) if float(total).is_integer() else str(total)


def tool_echo(text: str) -> str:
    return text


TOOL_FUNCS: dict[str, Callable[..., str]] = {"add": tool_add, "echo": tool_echo}
TOOL_SPECS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "add",
        "Add two numbers.",
        {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    ),
    (
        "echo",
        "Echo the given text back.",
        {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    ),
]
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": s}}
    for n, d, s in TOOL_SPECS
]


# --------------------------------------------------------------------------- #
# Worker side
# --------------------------------------------------------------------------- #


class Skip(Exception):
    """The client cannot run here (e.g. the engine is not importable yet)."""


def _check(text: str) -> None:
    # Checked outside the timed region: proves the loop ran both tools and fed the
    # results back, so a broken client cannot post a flattering number.
    if text != EXPECTED_TEXT:
        raise AssertionError(f"unexpected final text {text!r}, want {EXPECTED_TEXT!r}")


def _check_run(result: Any) -> None:
    _check(result.text)
    status = getattr(result, "status", "done")
    if status != "done" or result.turns != 2 or len(result.tool_calls) != 2:
        raise AssertionError(
            f"unexpected run result: status={status!r} turns={result.turns} "
            f"tool_calls={len(result.tool_calls)}"
        )


def _measure_sync(once: Callable[[], Any], check: Callable[[Any], None], n: int, warmup: int):
    for _ in range(warmup):
        check(once())
    gc.collect()
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        out = once()
        samples.append((clock() - t0) / 1e6)
        check(out)
    return samples


async def _measure_async(
    once: Callable[[], Awaitable[Any]], check: Callable[[Any], None], n: int, warmup: int
) -> list[float]:
    for _ in range(warmup):
        check(await once())
    gc.collect()
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        out = await once()
        samples.append((clock() - t0) / 1e6)
        check(out)
    return samples


def _bare_loop(post: Callable[[dict[str, Any]], dict[str, Any]]) -> str:
    """What a hand-written loop does: POST, run the tool calls, POST the grown transcript."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    body = {"model": MODEL, "messages": messages, "tools": OPENAI_TOOLS, "tool_choice": "auto"}
    msg = post(body)["choices"][0]["message"]
    messages.append(msg)
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        out = TOOL_FUNCS[fn["name"]](**json.loads(fn["arguments"]))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
    return post(body)["choices"][0]["message"]["content"]


HEADERS = {"Authorization": "Bearer k", "Content-Type": "application/json"}


def worker_http_client(base_url: str, n: int, warmup: int) -> tuple[list[float], dict[str, Any]]:
    import http.client
    import urllib.parse

    u = urllib.parse.urlsplit(base_url)
    path = u.path.rstrip("/") + "/chat/completions"
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)

    def post(body: dict[str, Any]) -> dict[str, Any]:
        # bytes body: http.client sends headers and body in one send() (no Nagle stall)
        conn.request("POST", path, body=json.dumps(body).encode(), headers=HEADERS)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
        return json.loads(data)

    try:
        samples = _measure_sync(lambda: _bare_loop(post), _check, n, warmup)
    finally:
        conn.close()
    return samples, {"library": "http.client (stdlib)"}


def worker_httpx_sync(base_url: str, n: int, warmup: int) -> tuple[list[float], dict[str, Any]]:
    import httpx

    url = base_url.rstrip("/") + "/chat/completions"
    with httpx.Client(headers=HEADERS, timeout=30) as http:

        def post(body: dict[str, Any]) -> dict[str, Any]:
            r = http.post(url, json=body)
            r.raise_for_status()
            return r.json()

        samples = _measure_sync(lambda: _bare_loop(post), _check, n, warmup)
    return samples, {"library": f"httpx {httpx.__version__}"}


async def worker_httpx_async(
    base_url: str, n: int, warmup: int
) -> tuple[list[float], dict[str, Any]]:
    return await _httpx_async_loop(base_url, n, warmup, None)


async def worker_httpx_async_aiohttp(
    base_url: str, n: int, warmup: int
) -> tuple[list[float], dict[str, Any]]:
    # The floor's loop over the transport our engine uses by default (httpx-aiohttp's
    # AiohttpTransport), so the table shows how much of "ours" is the transport and how
    # much the engine.
    try:
        import httpx_aiohttp
    except ImportError as exc:
        raise Skip(f"httpx-aiohttp not installed: {type(exc).__name__}: {exc}") from exc
    samples, info = await _httpx_async_loop(base_url, n, warmup, httpx_aiohttp.AiohttpTransport())
    info["library"] += " + httpx-aiohttp AiohttpTransport"
    return samples, info


async def _httpx_async_loop(
    base_url: str, n: int, warmup: int, transport: Any
) -> tuple[list[float], dict[str, Any]]:
    import httpx

    url = base_url.rstrip("/") + "/chat/completions"
    async with httpx.AsyncClient(headers=HEADERS, timeout=30, transport=transport) as http:

        async def post(body: dict[str, Any]) -> dict[str, Any]:
            r = await http.post(url, json=body)
            r.raise_for_status()
            return r.json()

        async def once() -> str:
            # Same steps as _bare_loop, awaited.
            messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
            body = {
                "model": MODEL,
                "messages": messages,
                "tools": OPENAI_TOOLS,
                "tool_choice": "auto",
            }
            msg = (await post(body))["choices"][0]["message"]
            messages.append(msg)
            for call in msg.get("tool_calls") or []:
                fn = call["function"]
                out = TOOL_FUNCS[fn["name"]](**json.loads(fn["arguments"]))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
            return (await post(body))["choices"][0]["message"]["content"]

        samples = await _measure_async(once, _check, n, warmup)
    return samples, {"library": f"httpx {httpx.__version__}"}


def _module_info(mod: Any) -> dict[str, Any]:
    from importlib import metadata

    try:
        version = metadata.version("toolnexus")
    except metadata.PackageNotFoundError:
        version = getattr(mod, "__version__", "unknown")
    return {"library": f"toolnexus {version}", "module": str(Path(mod.__file__).parent)}


async def worker_published(
    base_url: str, n: int, warmup: int
) -> tuple[list[float], dict[str, Any]]:
    # toolnexus 0.21.0 API (read from its client.py / toolkit.py / types.py):
    # Tool.execute is awaited (`await tool.execute(args, ctx)`), ToolResult.is_error has
    # no default, create_toolkit is async, Client.run(prompt, toolkit) is async and posts
    # with urllib in a worker thread (asyncio.to_thread), one connection per request.
    import toolnexus
    from toolnexus import Tool, ToolResult, create_client, create_toolkit

    def wrap(fn: Callable[..., str]) -> Callable[..., Awaitable[Any]]:
        async def execute(args: dict[str, Any], ctx: Any = None) -> Any:
            return ToolResult(output=fn(**args), is_error=False)

        return execute

    tools = [
        Tool(name=name, description=desc, input_schema=schema, source="native", execute=wrap(fn))
        for (name, desc, schema), fn in zip(TOOL_SPECS, TOOL_FUNCS.values(), strict=True)
    ]
    client = create_client(base_url=base_url, style="openai", model=MODEL, api_key="k")
    async with await create_toolkit(builtins=False, extra_tools=tools) as tk:
        samples = await _measure_async(lambda: client.run(PROMPT, tk), _check_run, n, warmup)
    return samples, _module_info(toolnexus)


async def worker_ours(base_url: str, n: int, warmup: int) -> tuple[list[float], dict[str, Any]]:
    sys.path.insert(0, str(REPO_DIR))
    try:
        import toolnexus
        from toolnexus import Tool, ToolResult, create_client, create_toolkit
    except ImportError as exc:
        raise Skip(f"engine not importable: {type(exc).__name__}: {exc}") from exc

    # Our engine accepts plain (sync) execute functions, so the tools are handed over
    # as they are; the published package needs async ones (see worker_published).
    def wrap(fn: Callable[..., str]) -> Callable[..., Any]:
        def execute(args: dict[str, Any], ctx: Any = None) -> Any:
            return ToolResult(output=fn(**args))

        return execute

    tools = [
        Tool(name=name, description=desc, input_schema=schema, source="native", execute=wrap(fn))
        for (name, desc, schema), fn in zip(TOOL_SPECS, TOOL_FUNCS.values(), strict=True)
    ]
    client = create_client(base_url=base_url, style="openai", model=MODEL, api_key="k")
    try:
        async with await create_toolkit(builtins=False, extra_tools=tools) as tk:
            samples = await _measure_async(lambda: client.run(PROMPT, tk), _check_run, n, warmup)
    finally:
        await client.aclose()
    info = _module_info(toolnexus)
    info["library"] = "toolnexus (repo)"
    return samples, info


WORKERS: dict[str, Callable[[str, int, int], Any]] = {
    "http.client": worker_http_client,
    "httpx-sync": worker_httpx_sync,
    "httpx-async": worker_httpx_async,
    "httpx-async-aiohttp": worker_httpx_async_aiohttp,
    "published": worker_published,
    "ours": worker_ours,
}


def run_worker(name: str, base_url: str, n: int, warmup: int) -> int:
    fn = WORKERS[name]
    try:
        out = fn(base_url, n, warmup)
        samples, info = asyncio.run(out) if asyncio.iscoroutine(out) else out
    except Skip as exc:
        print(SKIP_MARK + str(exc), flush=True)
        traceback.print_exc()
        return EXIT_SKIP
    info["python"] = platform.python_version()
    print(RESULT_MARK + json.dumps({"samples_ms": samples, "info": info}), flush=True)
    return 0


# --------------------------------------------------------------------------- #
# Parent side: venv, mock, rounds, table
# --------------------------------------------------------------------------- #


@dataclass
class Client:
    key: str
    label: str
    python: str | None = None  # None: skipped (see skip_reason)
    skip_reason: str = ""
    failure: str = ""  # traceback / stderr of a crashed run; stops later rounds
    info: dict[str, Any] = field(default_factory=dict)
    rounds: list[dict[str, float]] = field(default_factory=list)  # per round: p50/p95/mean


FLOOR = "httpx-async"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _installed_version(py: Path) -> str | None:
    if not py.exists():
        return None
    probe = "import importlib.metadata as m; print(m.version('toolnexus'))"
    r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def ensure_published(venv: Path) -> tuple[str | None, str]:
    """Return (python of a venv holding toolnexus 0.21.0, "") or (None, why it is skipped).

    Its own venv because it uses the same import name as our engine; reused when present.
    """
    py = _venv_python(venv)
    if _installed_version(py) == PUBLISHED_VERSION:
        return str(py), ""
    print(f"setting up {venv} (python -m venv + pip install toolnexus=={PUBLISHED_VERSION}) ...")
    try:
        if not py.exists():
            subprocess.run(
                [sys.executable, "-m", "venv", "--clear", str(venv)],
                check=True,
                capture_output=True,
                text=True,
            )
        # Bounded retries/timeout so an offline machine skips in about a minute, not ten.
        pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--retries", "1"]
        pip += ["--timeout", "30", f"toolnexus=={PUBLISHED_VERSION}"]
        r = subprocess.run(pip, capture_output=True, text=True, check=False, timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not create the venv: {exc}"
    if r.returncode != 0:
        tail = " / ".join(line for line in r.stderr.strip().splitlines()[-3:] if line.strip())
        return None, f"pip could not install toolnexus=={PUBLISHED_VERSION}: {tail}"
    if _installed_version(py) != PUBLISHED_VERSION:
        return None, f"toolnexus {PUBLISHED_VERSION} not importable in {venv} after pip"
    return str(py), ""


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the published worker must only see its venv
    for k in list(env):
        if k.lower() in ("http_proxy", "https_proxy", "all_proxy"):
            del env[k]  # loopback only: never route the mock through a proxy
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def start_mock() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, str(BENCH_DIR / "mock_llm.py"), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=_worker_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "READY <port>", or "" if it exited
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"mock model did not start (got {line!r})")
    return proc, int(line.split()[1])


def percentile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    k = (len(sorted_xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (k - lo)


def summarize(samples: list[float]) -> dict[str, float]:
    xs = sorted(samples)
    return {"p50": percentile(xs, 0.5), "p95": percentile(xs, 0.95), "mean": statistics.fmean(xs)}


def measure(client: Client, base_url: str, n: int, warmup: int, timeout: float) -> None:
    assert client.python is not None
    cmd = [client.python, str(Path(__file__).resolve()), "--worker", client.key]
    cmd += ["--base-url", base_url, "--requests", str(n), "--warmup", str(warmup)]
    try:
        r = subprocess.run(
            cmd, capture_output=True, text=True, env=_worker_env(), timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        client.failure = f"worker timed out after {timeout:.0f} s"
        return
    lines = r.stdout.splitlines()
    if r.returncode == EXIT_SKIP:
        skip = [ln[len(SKIP_MARK) :] for ln in lines if ln.startswith(SKIP_MARK)]
        client.skip_reason = skip[0] if skip else "skipped"
        client.failure = r.stderr.strip()  # kept for the report, not counted as a crash
        client.python = None
        return
    results = [ln[len(RESULT_MARK) :] for ln in lines if ln.startswith(RESULT_MARK)]
    if r.returncode != 0 or not results:
        client.failure = (r.stderr.strip() or r.stdout.strip())[-6000:]
        return
    payload = json.loads(results[-1])
    client.info = payload["info"]
    client.rounds.append(summarize(payload["samples_ms"]))


def _ratios(a: Client, b: Client, key: str) -> list[float]:
    # Per round: both clients ran in the same round, minutes apart at most.
    return [ra[key] / rb[key] for ra, rb in zip(a.rounds, b.rounds, strict=False)]


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def print_report(clients: list[Client], args: argparse.Namespace) -> None:
    by_key = {c.key: c for c in clients}
    floor = by_key.get(FLOOR)
    floor_ok = floor is not None and len(floor.rounds) > 0
    print()
    print(
        f"Engine overhead per request (2 model trips + 2 tools), {args.requests} requests "
        f"after {args.warmup} warm-ups, {args.rounds} round(s) interleaved."
    )
    print("Figures: median over rounds of each round's statistic; [p50 min-max over rounds].")
    print("Ratios: median over rounds of the same-round ratio vs the httpx.AsyncClient floor.")
    print()
    head = (
        f"{'client':<36} {'p50 ms':>7} {'p95 ms':>7} {'mean ms':>8}  "
        f"{'p50 range':<13} {'p50/floor':>9} {'p95/floor':>9}"
    )
    print(head)
    print("-" * len(head))
    for c in clients:
        if not c.rounds:
            status = f"SKIPPED: {c.skip_reason}" if c.skip_reason else "FAILED (see below)"
            print(f"{c.label:<36} {status}")
            continue
        p50 = _med([r["p50"] for r in c.rounds])
        p95 = _med([r["p95"] for r in c.rounds])
        mean = _med([r["mean"] for r in c.rounds])
        lo = min(r["p50"] for r in c.rounds)
        hi = max(r["p50"] for r in c.rounds)
        rng = f"[{lo:.2f}-{hi:.2f}]"
        if floor_ok and floor is not None:
            r50 = f"{_med(_ratios(c, floor, 'p50')):.2f}x"
            r95 = f"{_med(_ratios(c, floor, 'p95')):.2f}x"
        else:
            r50 = r95 = "n/a"
        print(f"{c.label:<36} {p50:7.3f} {p95:7.3f} {mean:8.3f}  {rng:<13} {r50:>9} {r95:>9}")
    print()

    ours, pub = by_key.get("ours"), by_key.get("published")

    def goal(label: str, a: Client | None, b: Client | None, key: str, limit: float) -> None:
        if a is None or b is None or not a.rounds or not b.rounds:
            missing = [c.label for c in (a, b) if c is not None and not c.rounds]
            print(f"{label:<34} n/a ({', '.join(missing) or 'client not selected'} missing)")
            return
        rs = _ratios(a, b, key)
        verdict = "OK" if _med(rs) <= limit else "MISSED"
        each = ", ".join(f"{x:.2f}" for x in rs)
        print(f"{label:<34} {_med(rs):.2f}  (goal <= {limit})  {verdict}   rounds: {each}")

    goal("ours / httpx floor (p50)", ours, floor, "p50", 1.3)
    goal("ours / httpx floor (p95)", ours, floor, "p95", 1.3)
    goal(f"ours / published {PUBLISHED_VERSION} (p50)", ours, pub, "p50", 0.8)
    goal(f"ours / published {PUBLISHED_VERSION} (mean)", ours, pub, "mean", 0.8)
    goal(f"ours / published {PUBLISHED_VERSION} (p95)", ours, pub, "p95", 1.0)

    # A shared 2-core VM drifts by tens of percent between rounds; say so instead of
    # letting one noisy round pass for a regression.
    noisy = [
        c.label
        for c in clients
        if len(c.rounds) > 1
        and (max(r["p50"] for r in c.rounds) - min(r["p50"] for r in c.rounds))
        > 0.25 * _med([r["p50"] for r in c.rounds])
    ]
    if noisy:
        print()
        print(
            f"note: p50 moved by more than 25% between rounds for {', '.join(noisy)}; "
            "the machine is noisy, rerun or raise --rounds before reading small differences."
        )

    notes = [c for c in clients if c.failure or c.skip_reason]
    for c in notes:
        print()
        if c.skip_reason:
            print(f"{c.label}: skipped — {c.skip_reason}")
        if c.failure and (args.verbose or not c.skip_reason):
            print(f"{c.label}: {'details' if c.skip_reason else 'FAILED'}:")
            for line in c.failure.splitlines()[-40:]:
                print(f"    {line}")
    print()
    for c in clients:
        if c.info:
            where = f" ({c.info['module']})" if "module" in c.info else ""
            print(f"  {c.label}: {c.info.get('library')}, python {c.info.get('python')}{where}")


ALL_CLIENTS: list[tuple[str, str]] = [
    ("http.client", "http.client keep-alive, 2 POSTs"),
    ("httpx-sync", "httpx.Client (sync), 2 POSTs"),
    ("httpx-async", "httpx.AsyncClient, 2 POSTs [floor]"),
    ("httpx-async-aiohttp", "httpx.AsyncClient + httpx-aiohttp"),
    ("published", f"published toolnexus {PUBLISHED_VERSION}"),
    ("ours", "ours (toolnexus, this repo)"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Per-request overhead of the toolnexus engine vs floors and the "
        f"published toolnexus {PUBLISHED_VERSION}, against a loopback mock model."
    )
    ap.add_argument(
        "--requests", type=int, default=100, help="timed requests per client and round (>= 30)"
    )
    ap.add_argument("--warmup", type=int, default=5, help="untimed requests first (default 5)")
    ap.add_argument(
        "--rounds", type=int, default=3, help="interleaved repetitions of the whole set"
    )
    ap.add_argument(
        "--clients",
        default=",".join(k for k, _ in ALL_CLIENTS),
        help="comma list out of: " + ", ".join(k for k, _ in ALL_CLIENTS),
    )
    ap.add_argument(
        "--venv", type=Path, default=DEFAULT_VENV, help="venv for the published package"
    )
    ap.add_argument("--no-published", action="store_true", help="skip the published package")
    ap.add_argument("--json", type=Path, help="also write per-round figures to this file")
    ap.add_argument("--verbose", action="store_true", help="print skip details (tracebacks)")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        return run_worker(args.worker, args.base_url, args.requests, args.warmup)

    if args.requests < 30:
        ap.error("--requests must be >= 30 (p95 over fewer samples is noise)")
    if args.warmup < 0 or args.rounds < 1:
        ap.error("--warmup must be >= 0 and --rounds >= 1")
    wanted = [k.strip() for k in args.clients.split(",") if k.strip()]
    unknown = sorted(set(wanted) - set(WORKERS))
    if unknown:
        ap.error(f"unknown client(s): {', '.join(unknown)}")

    clients = [Client(k, label, sys.executable) for k, label in ALL_CLIENTS if k in wanted]
    for c in clients:
        if c.key == "published":
            if args.no_published:
                c.python, c.skip_reason = None, "--no-published"
            else:
                c.python, c.skip_reason = ensure_published(args.venv)
            if c.python is None:
                print(f"published toolnexus {PUBLISHED_VERSION}: SKIPPED ({c.skip_reason})")

    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPU(s); "
        "mock model and each client in separate processes, loopback only"
    )
    mock, port = start_mock()
    base_url = f"http://127.0.0.1:{port}/v1"
    per_worker_timeout = 60 + 2.0 * (args.requests + args.warmup)
    try:
        for rnd in range(args.rounds):
            # Rotate the order each round so no client always runs first or last.
            order = clients[rnd % len(clients) :] + clients[: rnd % len(clients)]
            for c in order:
                if c.python is None or c.failure:
                    continue
                t0 = time.monotonic()
                measure(c, base_url, args.requests, args.warmup, per_worker_timeout)
                state = (
                    f"p50 {c.rounds[-1]['p50']:.3f} ms"
                    if c.rounds and len(c.rounds) == rnd + 1
                    else (f"skipped: {c.skip_reason}" if c.skip_reason else "FAILED")
                )
                print(
                    f"  round {rnd + 1}/{args.rounds}  {c.label:<36} {state}  ({time.monotonic() - t0:.1f} s)",
                    flush=True,
                )
                if mock.poll() is not None:
                    raise RuntimeError("mock model process died")
    finally:
        mock.terminate()
        try:
            mock.wait(timeout=5)
        except subprocess.TimeoutExpired:
            mock.kill()

    print_report(clients, args)
    if args.json:
        data = {c.key: {"label": c.label, "info": c.info, "rounds": c.rounds} for c in clients}
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    # Skips (no network, engine not importable yet) are reported, not errors; a client
    # that ran and crashed or answered wrongly is.
    crashed = [c for c in clients if c.failure and not c.skip_reason]
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
