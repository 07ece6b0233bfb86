"""Helpers for the MCP tests: the demo server as an `McpServer`, what it logged, its HTTP
mode as a subprocess, and a check that no server process outlives its test."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolnexus.mcp import McpServer

DEMO_SERVER = str(Path(__file__).with_name("demo_server.py"))
PYTHON = sys.executable


def demo(log: Path, name: str = "demo", **options: Any) -> McpServer:
    """The demo server over stdio, logging what it sees to `log`."""
    env = {"DEMO_MCP_LOG": str(log), **options.pop("env", {})}
    return McpServer.stdio(name, PYTHON, DEMO_SERVER, env=env, **options)


def events(log: Path, event: str | None = None) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in rows if event is None or r["event"] == event]


def answers(log: Path) -> list[tuple[str, Any]]:
    """What each answered question gave the server: (action, content)."""
    return [(r["action"], r.get("content")) for r in events(log, "answer")]


def server_pids(log: Path) -> list[int]:
    return [r["pid"] for r in events(log, "start")]


def alive(pid: int) -> bool:
    """Running (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def children() -> set[int]:
    """This process's live child processes (Linux /proc)."""
    me = os.getpid()
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == me:
            found.add(int(entry))
    return found


def wait_gone(pids: set[int], seconds: float = 5.0) -> set[int]:
    deadline = time.monotonic() + seconds
    while True:
        left = {p for p in pids if alive(p)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_leaked_servers() -> Iterator[None]:
    """Every server process a test started is gone once the test is over."""
    before = children()
    yield
    left = wait_gone(children() - before)
    assert not left, f"server processes left running: {sorted(left)}"


@contextlib.contextmanager
def http_server(kind: str, log: Path, token: str | None = None) -> Iterator[str]:
    """The demo server over streamable HTTP (`kind="http"`) or SSE (`"sse"`) on 127.0.0.1:
    yields its base URL (`http://127.0.0.1:<port>`), and stops it afterwards."""
    env = {**os.environ, "DEMO_MCP_LOG": str(log)}
    if token:
        env["DEMO_MCP_TOKEN"] = token
    proc = subprocess.Popen(
        [PYTHON, DEMO_SERVER, kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())  # printed once the socket listens
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
