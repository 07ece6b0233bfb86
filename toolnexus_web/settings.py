"""Settings for toolnexus-web. Every environment read happens here; with no variables set
this is a working local setup (SQLite file, in-memory channel layer, in-process worker)."""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

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


DEBUG = env_bool("DJANGO_DEBUG", True)
SECRET_KEY = env("DJANGO_SECRET_KEY") or ("dev-only-insecure-key" if DEBUG else "")
if not SECRET_KEY:
    raise RuntimeError("DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is off")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
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
    "django_tasks",
    "django_tasks_db",
]

MIDDLEWARE = [
    "approvals.web.middleware.requests_in_flight_middleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "approvals.web.middleware.RequestGuardMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "toolnexus_web.urls"
ASGI_APPLICATION = "toolnexus_web.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool(
        "DATABASE_POOL", False
    ):
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": int(env("DATABASE_POOL_SIZE", "10")),
            # Fail a request fast (503) rather than wait 30 s for a connection in an outage.
            "timeout": float(env("DATABASE_POOL_TIMEOUT", "5")),
        }
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
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        # channels-redis waits for messages with a 5 s blocking pop; redis-py
                        # 8 reads with a 5 s socket timeout by default, so an idle socket's
                        # consumer died with "Timeout reading". Reads must outlast the pop.
                        "socket_timeout": 15,
                        "socket_connect_timeout": 5,
                    }
                ],
                "capacity": 1000,
                "expiry": 30,
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# -- background work -----------------------------------------------------------------------

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

# -- auth, static, i18n --------------------------------------------------------------------

# ModelBackend's rules, one query per permission check instead of two.
AUTHENTICATION_BACKENDS = ["approvals.permissions.PermissionBackend"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
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

if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "approvals": {"handlers": ["console"], "level": env("TOOLNEXUS_LOG_LEVEL", "INFO")},
        # Server errors reach the console in production too (Django logs them only with DEBUG).
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}

# -- toolnexus -----------------------------------------------------------------------------

# Extra modules that register agents (besides every installed app's agents.py).
TOOLNEXUS_AGENT_MODULES = env_list("TOOLNEXUS_AGENT_MODULES")
# The demo agent's in-process model works offline; set to 0 to hide the demo agent.
TOOLNEXUS_DEMO_AGENT = env_bool("TOOLNEXUS_DEMO_AGENT", True)
# A running run's lease: its worker's heartbeat renews it every third of this; when the
# worker dies, another worker takes the run over once it lapses.
TOOLNEXUS_RUN_LEASE_SECONDS = int(env("TOOLNEXUS_RUN_LEASE_SECONDS", "30"))
# How often a worker expires overdue requests and recovers abandoned runs.
TOOLNEXUS_MAINTENANCE_SECONDS = float(env("TOOLNEXUS_MAINTENANCE_SECONDS", "10"))
# How often an idle worker looks for new tasks.
TOOLNEXUS_WORKER_INTERVAL = float(env("TOOLNEXUS_WORKER_INTERVAL", "0.2"))
# Default expiry for requests that carry no expiresAt (0: never).
TOOLNEXUS_REQUEST_TTL_SECONDS = int(env("TOOLNEXUS_REQUEST_TTL_SECONDS", "0"))
