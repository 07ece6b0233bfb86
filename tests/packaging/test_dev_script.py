"""`./dev`: what its commands start with, run against a stand-in environment (a `bin/python`
that prints what it was given, and the stamp that says the environment is installed), so
nothing is installed and no server starts."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def stand_in_venv(root: Path) -> Path:
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text('#!/bin/sh\necho "PATH=$PATH"\necho "ARGS=$*"\n')
    python.chmod(0o755)
    # setup() reinstalls unless this stamp (pyproject.toml and the lock, hashed) exists.
    made_from = (REPO / "pyproject.toml").read_bytes() + (
        REPO / "requirements" / "lock.txt"
    ).read_bytes()
    (venv / f".installed-{hashlib.sha1(made_from).hexdigest()[:12]}").touch()
    return venv


def test_dev_run_puts_the_environments_bin_first_on_path(tmp_path):
    """A stdio MCP server installed into the environment (mcp-server-time) is on PATH for
    the app `./dev run` starts, without activating the environment."""
    venv = stand_in_venv(tmp_path)
    env = {**os.environ, "VENV": str(venv), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        ["bash", str(REPO / "dev"), "run", "--port", "8123"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    lines = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert lines["ARGS"] == "manage.py serve --port 8123"
    assert lines["PATH"].split(os.pathsep)[0] == str(venv / "bin")
    assert lines["PATH"].endswith(":/usr/bin:/bin")  # the rest of PATH kept
