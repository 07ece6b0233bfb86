"""What the packaging and browser tests of a brand-new host project share: the wheel built
from this checkout, a fresh virtual environment with it installed, the README's "Add the
inbox to your project" section applied block by block.

Offline: the wheel is built with the setuptools already installed (`--no-build-isolation`),
and the fresh environment sees the locked dependencies of .venv through a .pth file naming a
directory of links to them (this project's own files left out), so pip resolves the wheel's
dependencies with `--no-index` and installs the wheel alone.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SECTION = "## Add the inbox to your project"
# What the wheel is built from (a copy: building in place would leave build/ and *.egg-info
# in the working tree).
SOURCES = ["pyproject.toml", "README.md", "toolnexus", "approvals", "toolnexus_web"]
# This project's own files in .venv (the editable install): the fresh environment must not
# see them, or it would import the checkout instead of the wheel.
OWN = re.compile(r"^(__editable__.*|toolnexus_web.*\.dist-info|toolnexus|approvals)$")


def run(*args, cwd, env=None, timeout=120, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block of the README's section, in order."""
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end > 0 else None]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def apply_block(project: Path, language: str, text: str) -> list[str]:
    """Apply one block to the project as a reader would; return the commands it asks to run.
    A code block's first line names its file and how: `# <file>: append` or `: new file`."""
    if language == "sh":
        commands = [line.split("#")[0].strip() for line in text.splitlines()]
        return [c for c in commands if c and not c.startswith("pip install")]
    first, _, body = text.partition("\n")
    match = re.fullmatch(r"# (\S+): (append|new file)", first.strip())
    assert match, f"a README block without '# <file>: append|new file': {first!r}"
    path = project / match.group(1)
    if match.group(2) == "append":
        assert path.exists(), f"the README appends to {path}, which startproject did not make"
        path.write_text(path.read_text() + "\n" + body)
    else:
        assert not path.exists(), f"the README makes {path}, which exists"
        path.write_text(body)
    return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_wheel(work: Path) -> Path:
    """The wheel of this checkout, built into `work`/dist."""
    source = work / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        item = REPO / name
        if item.is_dir():
            shutil.copytree(item, source / name, ignore=ignore)
        else:
            shutil.copy2(item, source / name)
    dist = work / "dist"
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--quiet",
        "-w",
        dist,
        source,
        cwd=work,
        timeout=180,
    )
    (built,) = dist.glob("toolnexus_web-*.whl")
    return built


def make_venv(wheel: Path, work: Path) -> Path:
    """A fresh virtual environment in `work`/venv with the wheel installed (and .venv's
    dependencies)."""
    env_dir = work / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", env_dir, cwd=work)
    deps = work / "deps"
    deps.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not OWN.match(entry.name) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    python = env_dir / "bin" / "python"
    fresh_site = Path(
        run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work
        ).stdout.strip()
    )
    (fresh_site / "locked-dependencies.pth").write_text(f"{deps}\n")
    # pip from .venv installs into the fresh interpreter (which has no pip of its own);
    # --no-index: the dependencies must already be there, at versions the wheel accepts.
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-index",
        "--find-links",
        wheel.parent,
        "--quiet",
        "toolnexus-web",
        cwd=work,
        timeout=180,
    )
    return env_dir


def host_env(venv: Path) -> dict[str, str]:
    """A host project's environment: the fresh venv first on PATH, nothing of this one's
    settings (no DJANGO_*, TOOLNEXUS_*, DATABASE_URL...)."""
    keep = {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def new_project(venv: Path, where: Path) -> tuple[Path, list[str]]:
    """`django-admin startproject` with the fresh venv's Django, then the README's section
    applied block by block; the project's directory and the commands the section asks to
    run, in order (`pip install` lines left out: the venv has the packages)."""
    python = venv / "bin" / "python"
    run(python, "-m", "django", "startproject", "shop", cwd=where, env=host_env(venv))
    project = where / "shop"  # the README's name
    commands: list[str] = []
    for language, text in readme_blocks():
        commands += apply_block(project, language, text)
    return project, commands
