"""Safe defaults: what `serve` does on a non-loopback bind (item 1 of the hardening issue),
and the security headers and `check --deploy` with DEBUG off (item 7).

Settings are read once per process, so every case that depends on the environment loads them
in a subprocess with that environment (and its own XDG_DATA_HOME, so no test touches the
developer's key file)."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sqlite3
import stat
import string
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
HARD_CODED_DEV_KEY = "dev-only-insecure-key"  # what settings used when no key was set
# What `check --deploy` accepts as a real key: 50 characters, many distinct ones.
REAL_KEY = "".join(
    secrets.choice(string.ascii_letters + string.digits + "!@#%^&*(-_=+)") for _ in range(50)
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "TOOLNEXUS_", "DATABASE_", "REDIS_"))
        and key != "XDG_DATA_HOME"
    }
    env.update(
        DJANGO_SETTINGS_MODULE="toolnexus_web.settings",
        XDG_DATA_HOME=str(tmp_path / "data"),
        TOOLNEXUS_SQLITE_PATH=str(tmp_path / "db.sqlite3"),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def _python(tmp_path: Path, code: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _settings(tmp_path: Path, **extra: str) -> dict:
    done = _python(
        tmp_path,
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({'DEBUG': s.DEBUG, 'SECRET_KEY': s.SECRET_KEY, "
        "'ALLOWED_HOSTS': s.ALLOWED_HOSTS}))",
        **extra,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _key_file(tmp_path: Path) -> Path:
    return tmp_path / "data" / "toolnexus-web" / "secret_key"


def _manage(tmp_path: Path, *args: str, timeout: float = 180, **extra: str):
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- item 1: exposure is safe by default -----------------------------------------------------


def test_a_non_loopback_bind_turns_debug_off_with_a_generated_key_kept_outside_the_repo(
    tmp_path,
):
    loaded = _settings(tmp_path, TOOLNEXUS_HOST="0.0.0.0")
    assert loaded["DEBUG"] is False
    key = loaded["SECRET_KEY"]
    assert key != HARD_CODED_DEV_KEY and len(key) >= 50

    path = _key_file(tmp_path)
    assert path.read_text().strip() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert ROOT not in path.resolve().parents

    # Generated once: the next start (and every process on this machine) reads the same key.
    assert _settings(tmp_path, TOOLNEXUS_HOST="0.0.0.0")["SECRET_KEY"] == key
    assert _settings(tmp_path)["SECRET_KEY"] == key


def test_a_non_loopback_bind_allows_the_hosts_it_is_reachable_by(tmp_path):
    wildcard = _settings(tmp_path, TOOLNEXUS_HOST="0.0.0.0")["ALLOWED_HOSTS"]
    assert socket.gethostname().lower() in [host.lower() for host in wildcard]
    assert "*" not in wildcard

    named = _settings(
        tmp_path, TOOLNEXUS_HOST="192.0.2.10", TOOLNEXUS_ALLOWED_HOSTS="approvals.example.com"
    )["ALLOWED_HOSTS"]
    assert "192.0.2.10" in named and "approvals.example.com" in named
    assert "*" not in named
    assert "[2001:db8::5]" in _settings(tmp_path, TOOLNEXUS_HOST="2001:db8::5")["ALLOWED_HOSTS"]


def test_the_default_allowed_hosts_are_loopback_names_only(tmp_path):
    """No `testserver` (the test client's Host) outside tests: pytest-django and Django's
    test runner add it themselves."""
    assert _settings(tmp_path)["ALLOWED_HOSTS"] == ["localhost", "127.0.0.1", "[::1]"]


def test_loopback_keeps_debug_but_never_the_hard_coded_key(tmp_path):
    loaded = _settings(tmp_path)  # no TOOLNEXUS_HOST: serve's default bind, 127.0.0.1
    assert loaded["DEBUG"] is True
    assert loaded["SECRET_KEY"] != HARD_CODED_DEV_KEY
    assert loaded["SECRET_KEY"] == _key_file(tmp_path).read_text().strip()
    assert _settings(tmp_path, TOOLNEXUS_HOST="localhost")["DEBUG"] is True


def test_a_given_secret_key_is_used_and_no_key_file_is_written(tmp_path):
    loaded = _settings(tmp_path, TOOLNEXUS_HOST="0.0.0.0", DJANGO_SECRET_KEY=REAL_KEY)
    assert loaded["SECRET_KEY"] == REAL_KEY
    assert not _key_file(tmp_path).exists()


def test_a_key_file_can_be_named(tmp_path):
    named = tmp_path / "keys" / "toolnexus.key"
    loaded = _settings(tmp_path, TOOLNEXUS_SECRET_KEY_FILE=str(named))
    assert named.read_text().strip() == loaded["SECRET_KEY"]
    assert stat.S_IMODE(named.stat().st_mode) == 0o600
    assert not _key_file(tmp_path).exists()


def test_loopback_hosts():
    from toolnexus_web.settings import is_loopback

    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "192.168.1.5", "example.com", "10.0.0.1"):
        assert not is_loopback(host), host


def test_serve_plans_demo_accounts_by_bind():
    from approvals.management.commands.serve import plan_exposure

    loopback = plan_exposure("127.0.0.1", demo_accounts=None, debug=True)
    assert loopback.loopback and loopback.demo_accounts and loopback.demo_superuser

    exposed = plan_exposure("0.0.0.0", demo_accounts=None, debug=False)
    assert not exposed.loopback and not exposed.demo_accounts and not exposed.demo_superuser

    asked = plan_exposure("0.0.0.0", demo_accounts=True, debug=False)
    assert asked.demo_accounts and not asked.demo_superuser  # reviewers, never a superuser

    assert not plan_exposure("127.0.0.1", demo_accounts=False, debug=True).demo_accounts


def test_serve_refuses_debug_on_a_non_loopback_bind():
    from approvals.management.commands.serve import plan_exposure

    with pytest.raises(CommandError, match="DEBUG"):
        plan_exposure("0.0.0.0", demo_accounts=None, debug=True)


@pytest.mark.django_db(transaction=True)
def test_demo_accounts_on_a_non_loopback_bind_make_no_superuser():
    from approvals.management.commands.serve import make_demo_accounts, plan_exposure

    made = make_demo_accounts(plan_exposure("0.0.0.0", demo_accounts=True, debug=False), "pw-1")
    assert [name for name, _ in made] == ["reviewer", "reviewer2", "watcher"]
    User = get_user_model()
    assert not User.objects.filter(is_superuser=True).exists()
    assert not User.objects.filter(is_staff=True).exists()
    assert User.objects.get(username="reviewer").check_password("pw-1")

    made = make_demo_accounts(plan_exposure("127.0.0.1", demo_accounts=None, debug=True), "pw-2")
    assert "admin" in [name for name, _ in made]
    assert User.objects.get(username="admin").is_superuser


def test_serve_on_a_non_loopback_address_warns_and_prints_no_superuser(tmp_path):
    """The whole start-up on an address this machine does not have (TEST-NET-1): everything
    happens up to the listen, which fails, so nothing is exposed by the test."""
    done = _manage(
        tmp_path,
        "serve",
        "--host",
        "192.0.2.10",
        "--port",
        "8000",
        "--demo-accounts",
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        TOOLNEXUS_DEMO_PASSWORD="demo-pass-123",
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out  # could not listen
    assert "could not listen" in out.lower(), out
    assert "WARNING" in out and "192.0.2.10" in out
    assert "DEBUG is off" in out
    assert "demo account: reviewer / demo-pass-123" in out
    assert "demo account: admin" not in out
    assert (tmp_path / "static" / "staticfiles.json").exists()  # DEBUG off: manifest collected
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:
        assert db.execute("select count(*) from auth_user where is_superuser").fetchone() == (0,)
        assert db.execute("select count(*) from auth_user").fetchone() == (3,)


def test_serve_without_demo_accounts_on_a_non_loopback_address(tmp_path):
    done = _manage(
        tmp_path,
        "serve",
        "--host",
        "192.0.2.10",
        "--port",
        "8000",
        "--no-worker",
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        TOOLNEXUS_DEMO_PASSWORD="demo-pass-123",
    )
    out = done.stdout + done.stderr
    assert "demo-pass-123" not in out and "demo account:" not in out, out
    assert "createsuperuser" in out
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:
        assert db.execute("select count(*) from auth_user").fetchone() == (0,)


def test_serve_with_debug_forced_on_a_non_loopback_bind_stops_before_listening(tmp_path):
    # An address this machine does not have: were the refusal gone, the listen would fail.
    done = _manage(
        tmp_path, "serve", "--host", "192.0.2.10", "--port", "8000", timeout=60, DJANGO_DEBUG="1"
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "DEBUG" in out and "serving on" not in out, out
    assert not (tmp_path / "db.sqlite3").exists()  # refused before migrating


@pytest.mark.django_db
def test_a_demo_superuser_stops_a_non_loopback_start_unless_allowed():
    """The `admin` an earlier loopback start made (its password printed) used to sign in on
    a bind other machines reach, with only a warning."""
    from approvals.management.commands.serve import (
        make_demo_accounts,
        plan_exposure,
        refuse_demo_superusers,
    )

    loopback = plan_exposure("127.0.0.1", demo_accounts=None, debug=True)
    exposed = plan_exposure("0.0.0.0", demo_accounts=None, debug=False)
    refuse_demo_superusers(exposed, 8000, allowed=False)  # nothing made yet
    make_demo_accounts(loopback, "pw-1")
    with pytest.raises(CommandError, match="--allow-demo-superuser") as refused:
        refuse_demo_superusers(exposed, 8000, allowed=False)
    assert "superuser admin" in str(refused.value) and "0.0.0.0:8000" in str(refused.value)
    refuse_demo_superusers(exposed, 8000, allowed=True)  # the operator said so
    refuse_demo_superusers(loopback, 8000, allowed=False)  # this machine only: as before

    User = get_user_model()
    User.objects.create_superuser("owner", password="the owner's own phrase 9")
    User.objects.filter(username="admin").update(is_active=False)
    refuse_demo_superusers(exposed, 8000, allowed=False)  # a project's own superuser: fine


def test_serve_refuses_a_non_loopback_bind_with_a_demo_superuser(tmp_path):
    made = _manage(
        tmp_path,
        "shell",
        "-c",
        "from django.core.management import call_command; "
        "call_command('migrate', verbosity=0); "
        "from approvals.permissions import ensure_demo_accounts; ensure_demo_accounts('pw-1')",
    )
    assert made.returncode == 0, made.stderr
    args = ("serve", "--host", "192.0.2.10", "--port", "8000", "--no-worker")
    static = {"DJANGO_STATIC_ROOT": str(tmp_path / "static")}
    done = _manage(tmp_path, *args, **static)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "refusing to serve on 192.0.2.10:8000" in out and "--allow-demo-superuser" in out
    assert "could not listen" not in out.lower(), out  # refused before listening

    # An address this machine does not have: allowed, the start goes on until the listen.
    done = _manage(tmp_path, *args, "--allow-demo-superuser", **static)
    out = done.stdout + done.stderr
    assert "refusing" not in out and "could not listen" in out.lower(), out
    assert "Demo accounts from an earlier loopback start exist (admin" in out


# -- item 7: headers and TLS -----------------------------------------------------------------

HEADERS_SCRIPT = """
import json, django
django.setup()
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()  # allows the test client's Host, testserver, as a test runner does
c = Client()
out = {}
for name, secure, extra in (("https", True, {}), ("http", False, {}),
                            ("proxied", False, {"HTTP_X_FORWARDED_PROTO": "https"})):
    r = c.get("/api/openapi.json", secure=secure, **extra)
    out[name] = {"status": r.status_code, "location": r.get("Location", ""),
                 "headers": dict(r.headers.items())}
print(json.dumps(out))
"""


def _headers(tmp_path: Path, **extra: str) -> dict:
    done = _python(
        tmp_path,
        HEADERS_SCRIPT,
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=REAL_KEY,
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        **extra,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _directives(policy: str) -> dict[str, list[str]]:
    parts = [p.strip().split() for p in policy.split(";") if p.strip()]
    return {p[0]: p[1:] for p in parts}


def test_security_headers_with_debug_off(tmp_path):
    got = _headers(tmp_path)
    https = got["https"]
    assert https["status"] == 200
    headers = {k.lower(): v for k, v in https["headers"].items()}
    policy = _directives(headers["content-security-policy"])
    assert policy["default-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"]  # no inline script, no eval
    assert policy["style-src"] == ["'self'"]
    assert policy["connect-src"] == ["'self'"]  # XHR and the live websockets, same host
    assert policy["object-src"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'none'"]
    assert policy["form-action"] == ["'self'"]
    assert headers["strict-transport-security"] == "max-age=31536000; includeSubDomains"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "same-origin"
    assert headers["cross-origin-opener-policy"] == "same-origin"

    # Plain HTTP is redirected to HTTPS, without HSTS (browsers ignore it over HTTP anyway).
    assert got["http"]["status"] == 301
    assert got["http"]["location"] == "https://testserver/api/openapi.json"
    # Without DJANGO_SECURE_PROXY_SSL_HEADER a proxy's header is not trusted.
    assert got["proxied"]["status"] == 301


def test_a_tls_proxy_header_is_trusted_only_when_configured(tmp_path):
    got = _headers(tmp_path, DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto")
    assert got["proxied"]["status"] == 200
    proxied = {k.lower(): v for k, v in got["proxied"]["headers"].items()}
    assert proxied["strict-transport-security"].startswith("max-age=31536000")
    assert got["http"]["status"] == 301


def test_plain_http_setups_can_turn_the_redirect_off(tmp_path):
    # The benches and the fault tests run DEBUG off over plain HTTP on loopback.
    assert _headers(tmp_path, DJANGO_SECURE_COOKIES="0")["http"]["status"] == 200
    assert _headers(tmp_path, DJANGO_SECURE_SSL_REDIRECT="0")["http"]["status"] == 200
    got = _headers(
        tmp_path, DJANGO_SECURE_HSTS_SECONDS="60", DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS="0"
    )
    hsts = {k.lower(): v for k, v in got["https"]["headers"].items()}["strict-transport-security"]
    assert hsts == "max-age=60"


def test_check_deploy_is_clean_with_debug_off_and_a_real_key(tmp_path):
    done = _manage(
        tmp_path,
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=REAL_KEY,
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "System check identified no issues" in out, out
    assert not re.search(r"\(security\.\w+\)|WARNING|ERROR", out), out


def test_check_deploy_is_clean_with_a_generated_key(tmp_path):
    done = _manage(
        tmp_path,
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        TOOLNEXUS_HOST="0.0.0.0",
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.django_db
def test_pages_carry_the_policy_in_debug_too():
    response = Client().get("/accounts/login/")
    assert response.status_code == 200
    policy = _directives(response["Content-Security-Policy"])
    assert policy["script-src"] == ["'self'"]
    html = response.content.decode()
    assert '<meta name="htmx-config"' in html
    config = json.loads(re.search(r"<meta name=\"htmx-config\" content='([^']*)'", html)[1])
    assert config["allowEval"] is False
    assert config["includeIndicatorStyles"] is False
    assert config["allowScriptTags"] is False


def test_templates_have_no_inline_script_or_style():
    """What the policy forbids, caught before a browser: hx-on and on* handlers, inline
    <script> bodies, style attributes and <style> blocks."""
    offenders = []
    for folder in (ROOT / "approvals" / "templates",):
        for path in folder.rglob("*.html"):
            text = path.read_text()
            for pattern in (
                r"\bhx-on[:-]",
                r"\son[a-z]+\s*=",
                r"<script(?![^>]*\bsrc=)[^>]*>",
                r"\sstyle\s*=",
                r"<style\b",
                r"javascript:",
            ):
                for match in re.finditer(pattern, text):
                    offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)!r}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("password", ["password123", "12345678901"])
def test_common_and_numeric_passwords_are_refused(password):
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        validate_password(password)


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("TOOLNEXUS_CLAIM_MINUTES", "1000000000", "at most 525600"),
        ("TOOLNEXUS_CLAIM_MINUTES", "half an hour", "a whole number"),
        ("TOOLNEXUS_INBOX_COUNT_CAP", "0", "at least 1"),
        ("TOOLNEXUS_LIVE_CHIP_SECONDS", "inf", "a finite number"),
        ("TOOLNEXUS_LIVE_CHIP_SECONDS", "100000", "from 0.0 to 86400"),
    ],
)
def test_a_bad_number_in_the_environment_stops_the_start_saying_which(
    tmp_path, variable, value, says
):
    done = _python(tmp_path, "import django; django.setup()", **{variable: value})
    assert done.returncode != 0
    assert variable in done.stderr and says in done.stderr, done.stderr[-600:]
