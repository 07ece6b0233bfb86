"""Settings for toolnexus-web. Every environment read happens here; with no variables set
this is a working local setup (SQLite file, in-memory channel layer, in-process worker)."""

from __future__ import annotations

import ipaddress
import math
import os
import secrets
import socket
import sys
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF

from approvals.conf import is_loopback  # also what `serve` decides exposure with
from approvals.telemetry.logs import check_format as check_log_format

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


# -- where `serve` listens, DEBUG, the secret key, allowed hosts ------------------------------


def bind_hosts(host: str) -> list[str]:
    """The Host names a non-loopback bind is reached by: the address itself, or for a
    wildcard (0.0.0.0, ::) this machine's names and addresses. Never "*"."""
    if is_loopback(host):
        return []
    bare = host.strip().strip("[]")
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        return [bare.lower()] if bare else bind_hosts("0.0.0.0")  # "" binds every interface
    if not address.is_unspecified:
        return [f"[{bare}]" if address.version == 6 else bare]
    names = {socket.gethostname(), socket.getfqdn()}
    addresses = set()
    try:
        for *_, sockaddr in socket.getaddrinfo(socket.gethostname(), None):
            addresses.add(sockaddr[0])
    except OSError:
        pass
    try:  # the address of the default route (a UDP "connect" sends nothing)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            addresses.add(probe.getsockname()[0])
    except OSError:
        pass
    hosts = sorted(name.lower() for name in names if name and not is_loopback(name))
    for found in sorted(addresses):
        ip = ipaddress.ip_address(found.split("%")[0])
        if not (ip.is_loopback or ip.is_unspecified or ip.is_link_local):
            hosts.append(f"[{ip}]" if ip.version == 6 else str(ip))
    return hosts


def secret_key_path() -> Path:
    """TOOLNEXUS_SECRET_KEY_FILE, else $XDG_DATA_HOME/toolnexus-web/secret_key (by default
    ~/.local/share/toolnexus-web/secret_key): outside the repository."""
    named = env("TOOLNEXUS_SECRET_KEY_FILE")
    if named:
        return Path(named).expanduser()
    data = env("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser() / "toolnexus-web" / "secret_key"


def load_or_create_secret_key(path: Path) -> str:
    """The key in `path`, generated (random, mode 0600) the first time. Processes racing to
    create it all end up with the first one written."""
    if BASE_DIR in path.resolve().parents:
        raise RuntimeError(f"the secret key file must be outside the repository, not {path}")
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(50) + "\n")
        try:
            os.link(temporary, path)  # atomic, and never over a key another process wrote
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    key = path.read_text().strip()
    if len(key) < 50:
        raise RuntimeError(f"{path} holds no usable secret key: delete it to make a new one")
    return key


# The address `manage.py serve` binds (its --host sets this; it re-executes itself when they
# differ, since settings are read before the command runs). Anything but loopback means other
# machines can connect: DEBUG is then off unless DJANGO_DEBUG says otherwise (and `serve`
# refuses DEBUG on such a bind).
TOOLNEXUS_HOST = env("TOOLNEXUS_HOST") or "127.0.0.1"
TOOLNEXUS_LOOPBACK = is_loopback(TOOLNEXUS_HOST)
DEBUG = env_bool("DJANGO_DEBUG", TOOLNEXUS_LOOPBACK)

# DJANGO_SECRET_KEY, else a random key generated once into a file outside the repository
# (every process on this machine shares it; set DJANGO_SECRET_KEY when several machines serve).
SECRET_KEY = env("DJANGO_SECRET_KEY")
TOOLNEXUS_SECRET_KEY_FILE = None
if not SECRET_KEY:
    TOOLNEXUS_SECRET_KEY_FILE = secret_key_path()
    try:
        SECRET_KEY = load_or_create_secret_key(TOOLNEXUS_SECRET_KEY_FILE)
    except OSError as exc:
        if not DEBUG:
            raise RuntimeError(
                f"DJANGO_SECRET_KEY is not set and {TOOLNEXUS_SECRET_KEY_FILE} cannot be "
                f"used ({exc}): set DJANGO_SECRET_KEY or TOOLNEXUS_SECRET_KEY_FILE"
            ) from exc
        print(
            f"warning: {TOOLNEXUS_SECRET_KEY_FILE} cannot be used ({exc}); this process uses "
            "a random secret key of its own (sessions end when it stops)",
            file=sys.stderr,
        )
        SECRET_KEY = secrets.token_urlsafe(50)
        TOOLNEXUS_SECRET_KEY_FILE = None

# Loopback names, plus the names `serve`'s bind is reached by, plus TOOLNEXUS_ALLOWED_HOSTS
# (`serve --allowed-host NAME`). Not the test client's `testserver`: test runners add it.
ALLOWED_HOSTS = [
    *env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]"),
    *bind_hosts(TOOLNEXUS_HOST),
    *env_list("TOOLNEXUS_ALLOWED_HOSTS"),
]
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "approvals",  # before django_tasks_db: its db_worker command adds maintenance duties
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "channels",
    "csp",
    "django_tasks",
    "django_tasks_db",
    "axes",  # sign-in lockout (docs/operations.md, "Security settings")
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Innermost but for axes (still before any view): it is sync-only, so every middleware
    # above it runs synchronously in the request's one thread. Above the async ones it made
    # each of them cross to the event loop and back for its own hooks (15 crossings per
    # request instead of 5, each waiting behind the live pages' work on that loop).
    "approvals.web.middleware.RequestGuardMiddleware",
    # The user and the run or request a URL names on each log line (and on its span); sync
    # as the guard is, so beside it it costs no crossing of its own.
    "approvals.telemetry.middleware.TelemetryMiddleware",
    # Last, as django-axes asks: turns a locked-out sign-in into the lockout page (429).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "toolnexus_web.urls"
ASGI_APPLICATION = "toolnexus_web.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The project's own templates (templates/base.html: the page the app's pages sit in).
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# -- database ------------------------------------------------------------------------------

DATABASE_URL = env("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_health_checks=True)}
    # psycopg's pool is on by default: a connection per request costs a TCP and auth
    # handshake each time (the decision path's benches measure it); DATABASE_POOL=0 opts out.
    _on_postgres = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    if _on_postgres and env_bool("DATABASE_POOL", True):
        # A pooled connection is checked at checkout by looking at its socket, not by a
        # round trip to the server (approvals/db/postgresql/base.py).
        DATABASES["default"]["ENGINE"] = "approvals.db.postgresql"
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": int(env("DATABASE_POOL_SIZE", "10")),
            # Fail a request fast (503) rather than wait 30 s for a connection in an outage.
            "timeout": float(env("DATABASE_POOL_TIMEOUT", "5")),
        }
    # Parameters bound by the server, and a statement run 5 times on a connection prepared
    # there: PostgreSQL then parses and plans the decision path's statements once per
    # connection, not on every call (bench/vs_langgraph.py, docs/operations.md).
    # DATABASE_PREPARED=0 binds on the client as Django does by default: for a pooler that
    # cannot keep prepared statements (PgBouncer in transaction mode before 1.21).
    if _on_postgres and env_bool("DATABASE_PREPARED", True):
        _options = DATABASES["default"].setdefault("OPTIONS", {})
        _options.setdefault("server_side_binding", True)
        _options.setdefault("prepare_threshold", 5)
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env("TOOLNEXUS_SQLITE_PATH") or str(BASE_DIR / "db.sqlite3"),
        }
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # However the file is named (TOOLNEXUS_SQLITE_PATH, the default, or
    # DATABASE_URL=sqlite:///...). Without these, a deferred transaction that has read and
    # then writes cannot wait for the write lock: SQLite fails it at once ("database is
    # locked"), so the losers of a race for one request got 503 instead of 409.
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets the in-process worker write while pages read; IMMEDIATE takes the
        # write lock up front, so two writers queue instead of failing mid-transaction.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        **DATABASES["default"].get("OPTIONS", {}),  # options given in a DATABASE_URL win
    }
    # A file, not :memory:, so the live server and worker threads share the test DB.
    _sqlite_test = DATABASES["default"].setdefault("TEST", {})
    _sqlite_test["NAME"] = (
        _sqlite_test.get("NAME")
        or env("TOOLNEXUS_TEST_SQLITE_PATH")
        or str(BASE_DIR / ".test-db.sqlite3")
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# -- live push -----------------------------------------------------------------------------

REDIS_URL = env("REDIS_URL")


def _redis_db(url: str) -> int:
    from redis.connection import parse_url  # as channels-redis's pool reads the URL

    return int(parse_url(url).get("db") or 0)


if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Redis pub/sub (channels-redis's other layer): a process subscribes once per group
            # and hands each message to its own pages. The list-based layer
            # (channels_redis.core) lost a group message for every page of a process when one
            # of its pages disconnected at the wrong moment (docs/operations.md, "Live pages";
            # tests/faults/test_layer_message_loss.py).
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        # Reads must outlast any wait on the socket (redis-py 8 reads with a
                        # 5 s timeout by default).
                        "socket_timeout": 15,
                        "socket_connect_timeout": 5,
                        # A subscription idle for long is pinged, so a connection a proxy
                        # dropped silently is noticed and made again (not deaf for good).
                        "health_check_interval": 30,
                        "socket_keepalive": True,
                    }
                ],
                # Pub/sub channels ignore Redis database numbers: the names carry it, so that
                # deployments on other databases of one Redis stay apart as before.
                "prefix": f"toolnexus.{_redis_db(REDIS_URL)}.",
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# -- background work -----------------------------------------------------------------------

# "webhooks": host webhooks' deliveries, run by their own worker beside the run worker.
TASKS = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "webhooks"]}
}

# -- auth, static, i18n --------------------------------------------------------------------

# ModelBackend's rules, one query per permission check instead of two; it asks django-axes
# first whether a sign-in is locked out (so it is axes' AxesStandaloneBackend too).
AUTHENTICATION_BACKENDS = ["approvals.permissions.PermissionBackend"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The project's own assets next to the app's: its icon and the brand stylesheet that themes
# the inbox (README, "Theming").
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env("DJANGO_STATIC_ROOT") or BASE_DIR / "staticfiles")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# Bodies past this get 413 (API) instead of being read into memory.
DATA_UPLOAD_MAX_MEMORY_SIZE = int(env("TOOLNEXUS_MAX_BODY_BYTES", str(256 * 1024)))

# -- sign-in lockout, throttles, API tokens, per-agent access (operations.md, "Security settings")


def env_int(name: str, default: int, minimum: int = 0, maximum: int | None = None) -> int:
    raw = env(name, str(default)).strip() or str(default)
    try:
        value = int(raw)
    except ValueError:
        raise RuntimeError(f"{name} must be a whole number, not {raw!r}") from None
    if value < minimum:
        raise RuntimeError(f"{name} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise RuntimeError(f"{name} must be at most {maximum}, not {value}")
    return value


def env_float(name: str, default: float, minimum: float = 0.0, maximum: float = math.inf) -> float:
    raw = env(name, str(default)).strip() or str(default)
    try:
        value = float(raw)
    except ValueError:
        raise RuntimeError(f"{name} must be a number, not {raw!r}") from None
    if not math.isfinite(value) or not minimum <= value <= maximum:
        raise RuntimeError(
            f"{name} must be a finite number from {minimum} to {maximum}, not {raw!r}"
        )
    return value


def env_rate(name: str, default: str) -> str:
    """A rate as django-ninja's throttles take it, "N/unit" (s, sec, m, min, h, hour, d,
    day); "", "0" or "off" turns that throttle off. Checked here, not on the first request."""
    raw = env(name, default).strip().lower()
    if raw in ("", "0", "off", "none"):
        return ""
    count, _, unit = raw.partition("/")
    if (
        not count.isdigit()
        or int(count) < 1
        or unit not in {"s", "sec", "m", "min", "h", "hour", "d", "day"}
    ):
        raise RuntimeError(f"{name} must look like 600/min (or 0 for no limit), not {raw!r}")
    return f"{int(count)}/{unit}"


# django-axes: a username is locked out from an address after this many wrong passwords in
# a row, for the cool-off time (the sign-in page says so, status 429); a right password
# before that resets the count. The admin's sign-in counts too. `manage.py axes_reset`
# lifts every lockout; `axes_reset_username NAME` one user's.
AXES_ENABLED = env_bool("TOOLNEXUS_LOGIN_LOCKOUT", True)
AXES_FAILURE_LIMIT = env_int("TOOLNEXUS_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("TOOLNEXUS_LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "approvals.web.views.locked_out"  # 429, says for how long
AXES_CLIENT_IP_CALLABLE = "approvals.permissions.client_ip"
AXES_VERBOSE = False  # no log line per attempt: attempts and lockouts are in the admin

# How many proxies of yours stand in front of the app, each appending the address it saw to
# X-Forwarded-For (nginx: `proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;`).
# 0 (no proxy): the connection's address. Lockout and throttles key on this address.
TOOLNEXUS_TRUSTED_PROXIES = env_int("TOOLNEXUS_TRUSTED_PROXIES", 0)

# API throttles (429 with Retry-After): per token, per user (every token and the session
# together), and wrong or expired bearer tokens per client address.
TOOLNEXUS_API_TOKEN_RATE = env_rate("TOOLNEXUS_API_TOKEN_RATE", "600/min")
TOOLNEXUS_API_USER_RATE = env_rate("TOOLNEXUS_API_USER_RATE", "1200/min")
TOOLNEXUS_API_AUTH_FAILURE_RATE = env_rate("TOOLNEXUS_API_AUTH_FAILURE_RATE", "30/min")
# Runs one user may start per minute (API and start page; 0: no cap).
TOOLNEXUS_RUNS_PER_MINUTE = env_int("TOOLNEXUS_RUNS_PER_MINUTE", 30)

# Throttle counters live in the cache: per process by default. With several server processes
# set TOOLNEXUS_CACHE_URL (e.g. redis://redis:6379/1, a database of its own) so they share
# one count.
TOOLNEXUS_CACHE_URL = env("TOOLNEXUS_CACHE_URL")
if TOOLNEXUS_CACHE_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": TOOLNEXUS_CACHE_URL,
            "KEY_PREFIX": "toolnexus",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# A new API token's lifetime in days (`api_token --days` overrides it per token; 0: never
# expires). Tokens made before expiry existed never expire until revoked.
TOOLNEXUS_TOKEN_DAYS = env_int("TOOLNEXUS_TOKEN_DAYS", 90)

# Whoever started a run may not approve or answer its requests, for every agent (per agent:
# the admin's "Agent access").
TOOLNEXUS_STARTER_CANNOT_APPROVE = env_bool("TOOLNEXUS_STARTER_CANNOT_APPROVE", False)

# The triage inbox: how long a claim lasts (minutes; 0: until released), where counts stop
# ("1000+"), and how often a live inbox of every pending request recounts its chips
# (seconds; approvals/conf.py says why each exists).
TOOLNEXUS_CLAIM_MINUTES = env_int("TOOLNEXUS_CLAIM_MINUTES", 30, maximum=525_600)  # a year
TOOLNEXUS_INBOX_COUNT_CAP = env_int(
    "TOOLNEXUS_INBOX_COUNT_CAP", 1000, minimum=1, maximum=10_000_000
)
TOOLNEXUS_LIVE_CHIP_SECONDS = env_float("TOOLNEXUS_LIVE_CHIP_SECONDS", 5.0, maximum=86_400)

# A run's page shows the model's reply as it is generated, in batches this many seconds
# apart; the demo's model generates its replies word by word (seconds per word).
TOOLNEXUS_STREAM_REPLIES = env_bool("TOOLNEXUS_STREAM_REPLIES", True)
TOOLNEXUS_STREAM_BATCH_SECONDS = env_float("TOOLNEXUS_STREAM_BATCH_SECONDS", 0.15, maximum=60)
TOOLNEXUS_DEMO_WORD_SECONDS = env_float("TOOLNEXUS_DEMO_WORD_SECONDS", 0.03, maximum=5)

# -- security headers and TLS (docs/operations.md, "Security settings") ----------------------

# No inline script or style, no eval: htmx runs with allowEval, includeIndicatorStyles and
# allowScriptTags off (approvals/base.html's htmx-config), and approvals/app.js holds every
# handler. CSP Level 3 'self' covers the live websockets (ws:/wss: to the same host and port).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

# A TLS-terminating proxy's header, e.g. "X-Forwarded-Proto" (value https) or
# "X-Forwarded-Proto,https". Set it only when the proxy always sets that header itself.
_proxy_ssl_header = env("DJANGO_SECURE_PROXY_SSL_HEADER")
if _proxy_ssl_header:
    _name, _, _value = (part.strip() for part in _proxy_ssl_header.partition(","))
    _name = _name.upper().replace("-", "_")
    SECURE_PROXY_SSL_HEADER = (
        _name if _name.startswith("HTTP_") else f"HTTP_{_name}",
        _value or "https",
    )

if not DEBUG:
    # DJANGO_SECURE_COOKIES=0 means plain HTTP (a loopback bench, a trusted network): the
    # redirect to HTTPS is then off too unless DJANGO_SECURE_SSL_REDIRECT says otherwise.
    SECURE_COOKIES = env_bool("DJANGO_SECURE_COOKIES", True)
    SESSION_COOKIE_SECURE = SECURE_COOKIES
    CSRF_COOKIE_SECURE = SECURE_COOKIES
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", SECURE_COOKIES)
    SECURE_HSTS_SECONDS = int(env("DJANGO_SECURE_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    # Preloading is a commitment browsers ship for months: an explicit opt-in, not a default.
    SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        SILENCED_SYSTEM_CHECKS = ["security.W021"]  # "SECURE_HSTS_PRELOAD is not True"

# Log lines as text (the default: the message alone, as ever) or JSON objects with the time,
# level, logger and the run id, request id and user they are about (docs/operations.md,
# "Traces and logs"). Traces: TOOLNEXUS_TRACING=1 or OTEL_EXPORTER_OTLP_ENDPOINT.
TOOLNEXUS_LOG_FORMAT = check_log_format(env("TOOLNEXUS_LOG_FORMAT", "text"))
TOOLNEXUS_TRACING = env_bool("TOOLNEXUS_TRACING", False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "approvals.telemetry.logs.ContextFilter"}},
    "formatters": {"json": {"()": "approvals.telemetry.logs.JsonFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["context"],
            **({"formatter": "json"} if TOOLNEXUS_LOG_FORMAT == "json" else {}),
        }
    },
    "loggers": {
        "approvals": {"handlers": ["console"], "level": env("TOOLNEXUS_LOG_LEVEL", "INFO")},
        # Server errors reach the console in production too (Django logs them only with DEBUG).
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
        # JSON: Django's own warnings (a CSRF refusal, a bad Host) as JSON lines too, not as
        # the text its DEBUG-only console handler writes. Text keeps Django's defaults.
        **(
            {"django": {"handlers": ["console"], "level": "WARNING", "propagate": False}}
            if TOOLNEXUS_LOG_FORMAT == "json"
            else {}
        ),
    },
}

# -- toolnexus -----------------------------------------------------------------------------

# Extra modules that register agents (besides every installed app's agents.py).
TOOLNEXUS_AGENT_MODULES = env_list("TOOLNEXUS_AGENT_MODULES")
# The demo agent's in-process model works offline; set to 0 to hide the demo agent.
TOOLNEXUS_DEMO_AGENT = env_bool("TOOLNEXUS_DEMO_AGENT", True)
# This project is the demo: `serve` applies migrations and, on loopback, makes the demo
# accounts (both off by default in a host project; approvals/conf.py).
TOOLNEXUS_SERVE_MIGRATE = True
TOOLNEXUS_DEMO_ACCOUNTS = True
# The app's pages sit in the project's page (templates/base.html), with its icon and brand.
TOOLNEXUS_BASE_TEMPLATE = "base.html"
# A running run's lease: its worker's heartbeat renews it every third of this; when the
# worker dies, another worker takes the run over once it lapses.
TOOLNEXUS_RUN_LEASE_SECONDS = int(env("TOOLNEXUS_RUN_LEASE_SECONDS", "30"))
# How often a worker expires overdue requests and recovers abandoned runs.
TOOLNEXUS_MAINTENANCE_SECONDS = float(env("TOOLNEXUS_MAINTENANCE_SECONDS", "10"))
# How long a task row that ended well is kept (0: removed as it ends).
TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS = int(env("TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS", "0"))
# How often an idle worker looks for new tasks.
TOOLNEXUS_WORKER_INTERVAL = float(env("TOOLNEXUS_WORKER_INTERVAL", "0.2"))
# `serve` (Daphne) closes slow and idle connections: an HTTP response not finished within
# TOOLNEXUS_HTTP_TIMEOUT s (503 if it had not started; 0: no limit), a connection idle or
# still sending its request for TOOLNEXUS_HTTP_IDLE_TIMEOUT s (0: never), a websocket the app
# has not accepted within TOOLNEXUS_WS_CONNECT_TIMEOUT s, and an open websocket that answers
# no ping (one every TOOLNEXUS_WS_PING_INTERVAL s) within TOOLNEXUS_WS_PING_TIMEOUT s.
TOOLNEXUS_HTTP_TIMEOUT = float(env("TOOLNEXUS_HTTP_TIMEOUT", "60"))
TOOLNEXUS_HTTP_IDLE_TIMEOUT = float(env("TOOLNEXUS_HTTP_IDLE_TIMEOUT", "60"))
# A request's head (its line and headers) must be in within this many seconds (0: no limit).
TOOLNEXUS_HTTP_HEADER_TIMEOUT = float(env("TOOLNEXUS_HTTP_HEADER_TIMEOUT", "30"))
TOOLNEXUS_WS_CONNECT_TIMEOUT = float(env("TOOLNEXUS_WS_CONNECT_TIMEOUT", "10"))
TOOLNEXUS_WS_PING_INTERVAL = float(env("TOOLNEXUS_WS_PING_INTERVAL", "20"))
TOOLNEXUS_WS_PING_TIMEOUT = float(env("TOOLNEXUS_WS_PING_TIMEOUT", "30"))
# Live pages (websockets) one account may hold open at once; more are refused (0: no cap).
TOOLNEXUS_MAX_SOCKETS_PER_USER = int(env("TOOLNEXUS_MAX_SOCKETS_PER_USER", "30"))
# Default expiry for requests that carry no expiresAt (0: never).
TOOLNEXUS_REQUEST_TTL_SECONDS = int(env("TOOLNEXUS_REQUEST_TTL_SECONDS", "0"))

# -- health and metrics (docs/operations.md, "Health and metrics") ---------------------------

# Each /readyz check's deadline (seconds), and how recent a worker's heartbeat must be
# (0: no worker check).
TOOLNEXUS_READY_TIMEOUT = env_float("TOOLNEXUS_READY_TIMEOUT", 3.0, minimum=0.1, maximum=9.0)
TOOLNEXUS_READY_WORKER_SECONDS = env_int("TOOLNEXUS_READY_WORKER_SECONDS", 60, maximum=86_400)
# /metrics answers only `Authorization: Bearer <this>`; unset, it answers 404. Multi-process
# mode: set PROMETHEUS_MULTIPROC_DIR for every server and worker process.
TOOLNEXUS_METRICS_TOKEN = env("TOOLNEXUS_METRICS_TOKEN")
TOOLNEXUS_METRICS_DB_TIMEOUT = env_float(
    "TOOLNEXUS_METRICS_DB_TIMEOUT", 2.0, minimum=0.1, maximum=30.0
)
# Probes reach the app over plain HTTP inside a cluster: no redirect to HTTPS for them.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]

# -- reviewers' notifications (README, "Notifications by email and chat") --------------------

# Off unless set: nobody's preferences are read and nothing is sent.
TOOLNEXUS_NOTIFICATIONS = env_bool("TOOLNEXUS_NOTIFICATIONS", False)
# The address people open the app at: the links in messages start with it.
if env("TOOLNEXUS_PUBLIC_BASE_URL"):
    TOOLNEXUS_PUBLIC_BASE_URL = env("TOOLNEXUS_PUBLIC_BASE_URL")
# Email goes through Django's mail backend: SMTP on EMAIL_HOST:EMAIL_PORT by default
# (DJANGO_EMAIL_BACKEND=django.core.mail.backends.filebased.EmailBackend with
# DJANGO_EMAIL_FILE_PATH writes files instead).
EMAIL_BACKEND = env("DJANGO_EMAIL_BACKEND") or "django.core.mail.backends.smtp.EmailBackend"
if env("DJANGO_EMAIL_FILE_PATH"):
    EMAIL_FILE_PATH = env("DJANGO_EMAIL_FILE_PATH")
EMAIL_HOST = env("EMAIL_HOST") or "localhost"
EMAIL_PORT = int(env("EMAIL_PORT") or "25")
EMAIL_HOST_USER = env("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL") or "toolnexus@localhost"
# Web Push to reviewers' browsers: a key pair from `manage.py vapid_keys` (both, or neither:
# approvals.W004), and a contact for the push services (default: mailto:DEFAULT_FROM_EMAIL).
TOOLNEXUS_VAPID_PUBLIC_KEY = env("TOOLNEXUS_VAPID_PUBLIC_KEY")
TOOLNEXUS_VAPID_PRIVATE_KEY = env("TOOLNEXUS_VAPID_PRIVATE_KEY")
TOOLNEXUS_VAPID_SUBJECT = env("TOOLNEXUS_VAPID_SUBJECT")

# -- Slack: interactive Approve / Decline in a team channel (README, "Slack") ----------------

# Off unless the token, the signing secret and the channel are all set (a check warns when
# only some are).
TOOLNEXUS_SLACK_BOT_TOKEN = env("TOOLNEXUS_SLACK_BOT_TOKEN")
TOOLNEXUS_SLACK_SIGNING_SECRET = env("TOOLNEXUS_SLACK_SIGNING_SECRET")
TOOLNEXUS_SLACK_CHANNEL = env("TOOLNEXUS_SLACK_CHANNEL")
TOOLNEXUS_SLACK_API_URL = env("TOOLNEXUS_SLACK_API_URL") or "https://slack.com/api/"
TOOLNEXUS_SLACK_TEAM_ID = env("TOOLNEXUS_SLACK_TEAM_ID")

# -- the team dashboard (/reports/) ----------------------------------------------------------

# Seconds a period's figures are kept before the database is read again (0: every view).
TOOLNEXUS_REPORTS_CACHE_SECONDS = env_int("TOOLNEXUS_REPORTS_CACHE_SECONDS", 60, maximum=86_400)
