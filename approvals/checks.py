"""System checks: what a project needs for the app to work, said before anything fails.

`manage.py check` (and every command that runs checks: migrate, serve, runserver, ...) reports
each missing or misplaced piece with an id and a hint that shows what to write:

- approvals.E001  HtmxMiddleware is not in MIDDLEWARE (pages read `request.htmx`)
- approvals.E002  the default task backend is not django-tasks-db's (runs never leave the
                  request, or fail inside it with no visible error)
- approvals.E003  an app the app needs is not in INSTALLED_APPS
- approvals.E004  no default channel layer (live pages cannot receive pushes)
- approvals.E005  "approvals" is listed after "django_tasks_db" (its `db_worker` would be
                  the stock one: no run leases, no expiry, no recovery)
- approvals.E006  the app's URLs are not included in ROOT_URLCONF
- approvals.E007  a triage setting out of its range (TOOLNEXUS_CLAIM_MINUTES,
                  TOOLNEXUS_INBOX_COUNT_CAP, TOOLNEXUS_LIVE_CHIP_SECONDS): said at start, not
                  as a failing page later (a claim lasting past year 1 overflows the date)
- approvals.E008  a database that cannot return an UPDATE's or INSERT's rows (`RETURNING`),
                  which the decision path reads back: PostgreSQL, or SQLite 3.35 or newer
- approvals.W001  LOGIN_URL leads nowhere in ROOT_URLCONF (signed-out reviewers are sent to a
                  404), or to the admin's sign-in, which refuses reviewers who are not staff
- approvals.W002  ALLOWED_HOSTS is empty with DEBUG off: every page is refused, and every
                  live page's socket (`manage.py serve`, unlike runserver, starts anyway)
- approvals.W003  the task backend's QUEUES leave out "webhooks": webhooks are never delivered
- approvals.W004  one of TOOLNEXUS_VAPID_PUBLIC_KEY / TOOLNEXUS_VAPID_PRIVATE_KEY is set
                  without the other: Web Push stays off
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks
from django.db import connections
from django.shortcuts import resolve_url
from django.urls import NoReverseMatch, Resolver404, resolve, reverse
from django.utils.module_loading import import_string

from .conf import WEBHOOK_QUEUE, app_settings, setting_name

HTMX_MIDDLEWARE = "django_htmx.middleware.HtmxMiddleware"
TASK_BACKEND = "django_tasks_db.DatabaseBackend"
# Apps whose parts the app uses: template tags (htmx, partials), the task queue's tables,
# and Django's own apps that sign-in, permissions and flash messages need.
REQUIRED_APPS = [
    ("django.contrib.auth", "users, groups and permissions"),
    ("django.contrib.contenttypes", "permissions"),
    ("django.contrib.sessions", "sign-in sessions, also on live pages"),
    ("django.contrib.messages", "the messages pages show after a decision"),
    ("django_htmx", "the {% htmx_script %} tag"),
    ("template_partials", "the {% partialdef %} tag"),
    ("django_tasks", "the task framework"),
    ("django_tasks_db", "the task queue's table"),
]
TASKS_EXAMPLE = (
    'TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend",'
    ' "QUEUES": ["default", "webhooks"]}}'
)
CHANNELS_EXAMPLE = (
    'CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}} '
    "(one process), or channels_redis.pubsub.RedisPubSubChannelLayer for several"
)


def _app_index(apps: list[str], name: str) -> int | None:
    """Where `name` (a module path, or an AppConfig path under it) is in INSTALLED_APPS."""
    for index, entry in enumerate(apps):
        if entry == name or entry.startswith(f"{name}.apps."):
            return index
    return None


def check_middleware(**kwargs: Any) -> list[checks.CheckMessage]:
    if HTMX_MIDDLEWARE in list(getattr(settings, "MIDDLEWARE", None) or []):
        return []
    return [
        checks.Error(
            f"{HTMX_MIDDLEWARE} is not in MIDDLEWARE: the app's pages read request.htmx.",
            hint=f'Add "{HTMX_MIDDLEWARE}" to MIDDLEWARE (anywhere after SessionMiddleware).',
            id="approvals.E001",
        )
    ]


def check_task_backend(**kwargs: Any) -> list[checks.CheckMessage]:
    configured = (getattr(settings, "TASKS", None) or {}).get("default")
    backend = (configured or {}).get("BACKEND")
    if backend:
        try:
            backend_class = import_string(backend)
            wanted = import_string(TASK_BACKEND)
        except ImportError:
            backend_class = wanted = None
        if isinstance(backend_class, type) and issubclass(backend_class, wanted):
            return _check_webhook_queue(configured)
    shown = f"is {backend}" if backend else "is not set (django-tasks then runs tasks inline)"
    return [
        checks.Error(
            f'The "default" task backend {shown}: runs would execute inside the request '
            "that starts or decides them, and a failure would leave them queued with no "
            "visible error.",
            hint=f"Set {TASKS_EXAMPLE} and run `manage.py db_worker` (or `manage.py serve`, "
            "which runs a worker in the server).",
            id="approvals.E002",
        )
    ]


def _check_webhook_queue(configured: dict[str, Any]) -> list[checks.CheckMessage]:
    # django-tasks allows only the queues listed (["default"] when QUEUES is not set).
    queues = configured.get("QUEUES", ["default"])
    if not queues or WEBHOOK_QUEUE in queues:
        return []
    return [
        checks.Warning(
            f'The "default" task backend\'s QUEUES leave out "{WEBHOOK_QUEUE}": webhook'
            " deliveries cannot be queued, so webhook subscriptions hear nothing.",
            hint=f'Add "{WEBHOOK_QUEUE}" to TASKS["default"]["QUEUES"], e.g. '
            f'"QUEUES": ["default", "{WEBHOOK_QUEUE}"].',
            id="approvals.W003",
        )
    ]


def check_installed_apps(**kwargs: Any) -> list[checks.CheckMessage]:
    installed = list(settings.INSTALLED_APPS)
    missing = [(name, why) for name, why in REQUIRED_APPS if _app_index(installed, name) is None]
    return [
        checks.Error(
            f'"{name}" is not in INSTALLED_APPS: the app needs it for {why}.',
            hint=f'Add "{name}" to INSTALLED_APPS.',
            id="approvals.E003",
        )
        for name, why in missing
    ]


def check_channel_layer(**kwargs: Any) -> list[checks.CheckMessage]:
    layers = getattr(settings, "CHANNEL_LAYERS", None) or {}
    if (layers.get("default") or {}).get("BACKEND"):
        return []
    return [
        checks.Error(
            "No default channel layer (CHANNEL_LAYERS): live pages would never receive a "
            "change, and a decision's push would fail.",
            hint=f"Set {CHANNELS_EXAMPLE}.",
            id="approvals.E004",
        )
    ]


def check_app_order(**kwargs: Any) -> list[checks.CheckMessage]:
    installed = list(settings.INSTALLED_APPS)
    ours = _app_index(installed, "approvals")
    theirs = _app_index(installed, "django_tasks_db")
    if ours is None or theirs is None or ours < theirs:
        return []
    return [
        checks.Error(
            '"approvals" is listed after "django_tasks_db" in INSTALLED_APPS, so '
            "`manage.py db_worker` is django-tasks-db's own command: its workers would hold "
            "no run leases, never expire overdue requests and never recover the runs of a "
            "dead worker.",
            hint='Move "approvals" above "django_tasks_db" in INSTALLED_APPS.',
            id="approvals.E005",
        )
    ]


def check_urls(**kwargs: Any) -> list[checks.CheckMessage]:
    if not getattr(settings, "ROOT_URLCONF", None):
        return []  # Django reports that itself
    try:
        reverse("approvals:inbox")
        reverse("approvals:live-inbox")
        reverse("approvals:toolnexus_api:api-root")
    except NoReverseMatch:
        return [
            checks.Error(
                f"The app's URLs are not included in ROOT_URLCONF ({settings.ROOT_URLCONF}).",
                hint='Add path("approvals/", include("approvals.urls")) to urlpatterns (any '
                "prefix: pages, the API under api/ and the live pages' sockets under ws/).",
                id="approvals.E006",
            )
        ]
    except Exception:  # a URLconf that fails to import: Django's own URL check says why
        return []
    return []


SIGN_IN_HINT = (
    'Add path("accounts/", include("approvals.auth_urls")) to urlpatterns (the app\'s sign-in '
    'page at Django\'s default LOGIN_URL; at another prefix set LOGIN_URL = "login"), or point '
    "LOGIN_URL at the project's own sign-in page."
)


def check_login_url(**kwargs: Any) -> list[checks.CheckMessage]:
    """The app's pages send signed-out visitors to settings.LOGIN_URL: it must be a page."""
    if not getattr(settings, "ROOT_URLCONF", None):
        return []
    try:
        url = resolve_url(settings.LOGIN_URL)
    except NoReverseMatch:
        return [_login_url_warning(f"LOGIN_URL ({settings.LOGIN_URL!r}) names no URL.")]
    except Exception:  # a URLconf that fails to import: Django's own URL check says why
        return []
    parts = urlsplit(str(url))
    if parts.scheme or parts.netloc:
        return []  # a sign-in served elsewhere (another site, a proxy): not ours to check
    path = parts.path
    prefix = getattr(settings, "FORCE_SCRIPT_NAME", None)
    if prefix and path.startswith(prefix.rstrip("/") + "/"):
        path = path[len(prefix.rstrip("/")) :]
    try:
        match = resolve(path)
    except Resolver404:
        return [
            _login_url_warning(
                f"LOGIN_URL ({settings.LOGIN_URL!r}) is no page of ROOT_URLCONF "
                f"({settings.ROOT_URLCONF}): signed-out reviewers would be sent to a 404."
            )
        ]
    except Exception:
        return []
    if match.namespaces[:1] == ["admin"] and match.url_name == "login":
        return [
            _login_url_warning(
                f"LOGIN_URL ({settings.LOGIN_URL!r}) is the admin's sign-in, which refuses "
                "every account that is not staff: reviewers could not sign in."
            )
        ]
    return []


def _login_url_warning(message: str) -> checks.CheckMessage:
    return checks.Warning(message, hint=SIGN_IN_HINT, id="approvals.W001")


# (name, smallest, largest, whole numbers only): the triage settings' ranges.
MAX_CLAIM_MINUTES = 525_600  # a year; 0 means a claim never lapses
TRIAGE_RANGES = [
    ("CLAIM_MINUTES", 0, MAX_CLAIM_MINUTES, True),
    ("INBOX_COUNT_CAP", 1, 10_000_000, True),
    ("LIVE_CHIP_SECONDS", 0, 86_400, False),
]


def check_triage_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    errors = []
    for name, low, high, whole in TRIAGE_RANGES:
        value = getattr(app_settings, name)
        kinds = (int,) if whole else (int, float)
        number = isinstance(value, kinds) and not isinstance(value, bool)
        if number and low <= value <= high:  # NaN and infinities fail the comparison
            continue
        kind = "a whole number" if whole else "a number"
        errors.append(
            checks.Error(
                f"{setting_name(name)} is {value!r}: it must be {kind} from {low} to {high}.",
                hint=f"Set {setting_name(name)} in settings (or the environment) within range.",
                id="approvals.E007",
            )
        )
    return errors


def check_allowed_hosts(**kwargs: Any) -> list[checks.CheckMessage]:
    """With DEBUG on, an empty ALLOWED_HOSTS allows the loopback names (Django's fallback,
    which the live pages' origin check follows); with DEBUG off it allows nothing."""
    if settings.DEBUG or list(getattr(settings, "ALLOWED_HOSTS", None) or []):
        return []
    return [
        checks.Warning(
            "ALLOWED_HOSTS is empty and DEBUG is off: every page is refused (400) and every "
            "live page's socket (403).",
            hint='Set ALLOWED_HOSTS to the names the app is reached by, e.g. ["localhost", '
            '"127.0.0.1"] or ["approvals.example.com"].',
            id="approvals.W002",
        )
    ]


def check_databases(**kwargs: Any) -> list[checks.CheckMessage]:
    """The decision path claims a run with `UPDATE ... RETURNING` and inserts rows with
    `INSERT ... RETURNING` (domain.statements): PostgreSQL, or SQLite 3.35 or newer."""
    errors = []
    for alias in connections:
        connection = connections[alias]  # its vendor and features need no server connection
        if connection.vendor == "postgresql" or (
            connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert
        ):
            continue
        errors.append(
            checks.Error(
                f"Database {alias!r} ({connection.vendor}) cannot return the rows an UPDATE or"
                " an INSERT changed (RETURNING), which the app's decision path reads back.",
                hint="Use PostgreSQL, or SQLite 3.35 or newer (the one Python's sqlite3"
                " module links).",
                id="approvals.E008",
            )
        )
    return errors


def check_vapid_keys(**kwargs: Any) -> list[checks.CheckMessage]:
    """Push is offered only with both keys: one alone is a half-done setup, said at start
    rather than found out when no push ever comes."""
    public, private = app_settings.VAPID_PUBLIC_KEY, app_settings.VAPID_PRIVATE_KEY
    if bool(public) == bool(private):
        return []
    missing = setting_name("VAPID_PRIVATE_KEY" if public else "VAPID_PUBLIC_KEY")
    return [
        checks.Warning(
            f"{missing} is not set, but the other VAPID key is: Web Push is off.",
            hint="Set both keys of one pair (`manage.py vapid_keys` prints a new pair), or"
            " neither.",
            id="approvals.W004",
        )
    ]


SLACK_SETTINGS = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_CHANNEL")


def check_slack_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    """Slack is on only with all three set: some of them alone is a half-done setup that
    would otherwise be silently off."""
    missing = [setting_name(n) for n in SLACK_SETTINGS if not getattr(app_settings, n)]
    if not missing or len(missing) == len(SLACK_SETTINGS):
        return []
    return [
        checks.Warning(
            f"Slack is off: {', '.join(missing)} not set (the others are).",
            hint="Set TOOLNEXUS_SLACK_BOT_TOKEN, TOOLNEXUS_SLACK_SIGNING_SECRET and"
            ' TOOLNEXUS_SLACK_CHANNEL together, or none of them (README, "Slack").',
            id="approvals.W010",
        )
    ]


SETTINGS_CHECKS = [
    check_middleware,
    check_task_backend,
    check_installed_apps,
    check_channel_layer,
    check_app_order,
    check_triage_settings,
    check_databases,
    check_allowed_hosts,
    check_vapid_keys,
    check_slack_settings,
]


def register() -> None:
    """Called from the app's ready()."""
    for check in SETTINGS_CHECKS:
        checks.register(check, "approvals")
    checks.register(check_urls, checks.Tags.urls, "approvals")
    checks.register(check_login_url, checks.Tags.urls, "approvals")


def run_all() -> Iterable[checks.CheckMessage]:
    """Every check of the app (tests, and anyone who wants them without `manage.py check`)."""
    for check in [*SETTINGS_CHECKS, check_urls, check_login_url]:
        yield from check()
