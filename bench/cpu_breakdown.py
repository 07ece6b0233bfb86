"""Where a process's CPU goes, by part of the decision path: py-spy on the process itself,
sampling only the thread that holds the GIL (`--gil`: Python work, not waits), each sample
booked to the innermost part of the stack it recognises.

Used by `vs_langgraph.py --profile`. The parts are named by the functions that own them
(see PARTS); a sample inside no named part is "other". Innermost wins: the run claim a
worker makes inside django-tasks-db's claim of the task row is the run claim's, the
library's own statements around it are the task queue's.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

# (part, pattern on "function (path/file.py)"): the innermost frame that one of these
# matches takes the sample for the first part matching it.
PARTS: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in [
        ("live pushes to open pages", r"\(approvals/live/"),
        (
            "task queue (django-tasks-db): enqueue, poll, claim, finish",
            r"\(django_tasks_db/|\(django_tasks/|^_wake_on_enqueue |^finish_with_outcome ",
        ),
        ("database connection checkout (pool, health check)", r"^BaseDatabaseWrapper\.connect "),
        ("worker: run claim + the decided request's read", r"^run_claim_step "),
        ("worker: executor, journal, answer", r"^_answer_for "),
        # A call a rule decides (bench/vs_langgraph.py's `rule` phase): the approved relay
        # call's executor and journal, and, around it, the rules' read, match and record.
        ("worker: a rule-approved call's executor + journal (run_inline)", r"^run_inline "),
        (
            "worker: rule read, match, record (request, calls, counter, events)",
            r"\(approvals/execution/rules\.py\)",
        ),
        ("engine: run_with_answer / run (toolnexus, fake model)", r"\(toolnexus/|^_drive "),
        ("worker: outcome (transcript, run, applied mark, events)", r"^run_store_result "),
        ("worker: run start and halt bookkeeping (services.run_start)", r"^run_start "),
        (
            "decision: lock, checks, request, calls, run, events, commit",
            r"^request_(approve|decline) ",
        ),
    ]
]
# Frames of the plumbing between threads and the event loop take a sample only when no part
# above is in its stack (an asyncio frame inside a push is the push's).
HOPS_NAME = "thread and event-loop hops (asgiref, asyncio)"
HOPS_PATTERN = re.compile(r"\(asgiref/|\(asyncio/")
# Most of it: psycopg running a statement, sampled while its C wait loop drives it, where
# py-spy reads the stack only up to that loop (which part ran the statement is lost).
OTHER = "unattributed (psycopg stacks read in part, the stock loop, the bench)"

READY_LINE = "Sampling process"  # what py-spy prints (on stdout) once it samples


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)  # <linux/prctl.h>


def allow_sampling_by_children() -> None:
    """Let a child process (py-spy started by this one) read this process: Linux's Yama
    (`ptrace_scope` 1, a common default) lets a process trace only its descendants."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)


def start(pid: int, out: Path, rate: int = 250) -> subprocess.Popen[str]:
    """Sample `pid` (GIL holder only, without stopping it) into `out` (raw collapsed stacks)
    until `stop`; returns once py-spy samples."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("--profile needs py-spy: pip install py-spy (into the venv)")
    cmd = [exe, "record", "--pid", str(pid), "--gil", "--nonblocking", "--rate", str(rate)]
    spy = subprocess.Popen(
        [*cmd, "--format", "raw", "--output", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert spy.stdout is not None and spy.stderr is not None
    for line in spy.stdout:  # until py-spy says it samples, or exits
        if READY_LINE in line:
            # What py-spy says from now on is read and dropped: a full pipe would stall it.
            for pipe in (spy.stdout, spy.stderr):
                threading.Thread(target=pipe.read, daemon=True).start()
            return spy
    spy.wait()
    raise RuntimeError(f"py-spy could not sample pid {pid}: {spy.stderr.read().strip()[-300:]}")


def stop(spy: subprocess.Popen[str]) -> None:
    spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    try:
        spy.wait(timeout=30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()


def frame_name(frame: str) -> str:
    # "func (path/file.py:123)" -> "func (path/file.py)"
    head, sep, rest = frame.partition(" (")
    return f"{head} ({rest.rstrip(')').rsplit(':', 1)[0]})" if sep else frame


def part_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, pattern in PARTS:
            if pattern.search(frame):
                return name
    return HOPS_NAME if any(HOPS_PATTERN.search(f) for f in frames) else OTHER


def samples_by_part(paths: list[Path]) -> Counter[str]:
    """Samples per part over py-spy raw files (`--threads` or not)."""
    counts: Counter[str] = Counter()
    for path in paths:
        if not path.exists():
            print(f"  (py-spy wrote no {path}: its samples are missing)", file=sys.stderr)
            continue
        for line in path.read_text(errors="replace").splitlines():
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():
                continue
            counts[part_of([frame_name(f) for f in stack.split(";") if f])] += int(n)
    return counts


def table(counts: Counter[str], cpu_ms_per_op: float) -> list[str]:
    """Each part's share of the samples, and that share of the CPU per operation."""
    total = sum(counts.values())
    if not total:
        return ["    (no samples)"]
    order = [name for name, _ in PARTS] + [HOPS_NAME, OTHER]
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], order.index(kv[0])))
    out = [f"    {'part':<70} {'share':>6} {'ms/op':>6}"]
    for name, n in rows:
        share = n / total
        out.append(f"    {name:<70} {100 * share:5.1f}% {share * cpu_ms_per_op:6.2f}")
    out.append(f"    {'(' + str(total) + ' samples)':<70} {'':>6} {cpu_ms_per_op:6.2f}")
    return out
