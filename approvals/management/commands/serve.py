"""`python manage.py serve`: the whole app in one process.

Serves the project's ASGI application (HTTP and websockets) with Daphne, with a worker
running on the server's event loop: ASGI_APPLICATION, else the asgi.py next to the settings
(startproject's layout, where the README adds the live pages' sockets). In any project it serves what the project configured and
touches nothing else; what this repository's demo project adds is opt-in through settings:
TOOLNEXUS_SERVE_MIGRATE (apply migrations first; otherwise unapplied ones are only reported)
and TOOLNEXUS_DEMO_ACCOUNTS (on loopback, make the demo accounts and print their password);
with TOOLNEXUS_DEMO_AGENT, the demo's two example rules are made, off, once.

Demo accounts are made once and marked (the "Demo accounts" group); only those get a fresh
password at each start. An existing user of the same name that serve did not make is never
given a password or made a superuser.

Loopback (the default, 127.0.0.1) is the laptop setup: DEBUG on, demo accounts with a printed
password, the `admin` superuser among them. Any other bind (`--host 0.0.0.0`) lets other
machines connect, so: DEBUG off (refused if forced on), the allowed hosts follow the bind, no
demo accounts unless `--demo-accounts` (reviewers only: never a superuser with a printed
password), static files collected, and a warning saying so; a demo superuser left active by
an earlier loopback start stops the start unless `--allow-demo-superuser`. Settings are read before a
command runs, so when the bind is not the one they were loaded for (`TOOLNEXUS_HOST`, a
setting of the demo project), the command runs itself again with `TOOLNEXUS_HOST` set.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils.module_loading import import_string

from approvals import events
from approvals.conf import app_settings, is_loopback

REEXEC_MARK = "TOOLNEXUS_SERVE_REEXEC"
DEMO_NAMES = ("reviewer", "reviewer2", "watcher", "admin")
# The demo accounts that may exist on a non-loopback bind (asked for with --demo-accounts).
DEMO_REVIEWERS = [
    ("reviewer", "Reviewers", "can decide"),
    ("reviewer2", "Reviewers", "can decide"),
    ("watcher", "Watchers", "view only"),
]


def env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


@dataclass(frozen=True)
class Exposure:
    host: str
    loopback: bool
    demo_accounts: bool  # create (or reset) the demo accounts and print their password
    demo_superuser: bool  # ... the `admin` superuser among them


def plan_exposure(host: str, *, demo_accounts: bool | None, debug: bool) -> Exposure:
    """What `serve` does on `host`. demo_accounts: --demo-accounts (True),
    --no-demo-accounts (False), neither (None: on loopback when TOOLNEXUS_DEMO_ACCOUNTS)."""
    loopback = is_loopback(host)
    if debug and not loopback:
        raise CommandError(
            f"DEBUG is on and {host!r} is not a loopback address: a DEBUG server shows "
            "tracebacks and settings to anyone who can reach it. Unset DJANGO_DEBUG (it is "
            "off by default on such a bind), or serve on 127.0.0.1."
        )
    if demo_accounts is None:
        demo_accounts = loopback and bool(app_settings.DEMO_ACCOUNTS)
    return Exposure(host, loopback, demo_accounts, demo_superuser=demo_accounts and loopback)


def refuse_demo_superusers(plan: Exposure, port: int, *, allowed: bool) -> None:
    """On a bind other machines reach, a demo superuser (made by an earlier loopback start,
    its password printed there) would let anyone who saw that password administer the app:
    no start until it is gone, or the operator says it may stay (--allow-demo-superuser)."""
    from approvals.permissions import demo_superusers

    if plan.loopback or allowed:
        return
    try:
        names = demo_superusers()
    except DatabaseError:  # no tables yet (`manage.py migrate` is reported): no users either
        return
    if not names:
        return
    shown = ", ".join(names)
    raise CommandError(
        f"refusing to serve on {plan.host}:{port}, which other machines can reach: the "
        f"superuser {shown} was made by an earlier start on loopback, which printed its "
        "password. Deactivate or delete it (the admin, or `manage.py shell`), or start with "
        "--allow-demo-superuser to serve with it (then change its password: `manage.py "
        f"changepassword {names[0]}`)."
    )


def make_demo_accounts(plan: Exposure, password: str) -> list[tuple[str, str]]:
    """The demo accounts `plan` allows, with `password`: all four on loopback, the reviewers
    and the watcher (no staff, no superuser) on any other bind. Only accounts serve made
    itself get the password; a user of the same name it did not make is left alone (and is
    not in the list)."""
    from approvals.permissions import ensure_demo_accounts

    if not plan.demo_accounts:
        return []
    return ensure_demo_accounts(password, superuser=plan.demo_superuser)


def asgi_application_path() -> str | None:
    """Where the project's ASGI application is: ASGI_APPLICATION, else the `application` of
    the asgi.py that `startproject` puts next to the settings (and the URLconf), which is
    where the README has the live pages' sockets added; startproject does not set
    ASGI_APPLICATION. None when there is neither."""
    path = getattr(settings, "ASGI_APPLICATION", None)
    if path:
        return path
    wsgi = getattr(settings, "WSGI_APPLICATION", None) or ""
    for module in (settings.SETTINGS_MODULE, settings.ROOT_URLCONF, wsgi.rpartition(".")[0]):
        package = (module or "").rpartition(".")[0]
        if not package:
            continue
        try:
            found = importlib.util.find_spec(f"{package}.asgi") is not None
        except ImportError:
            found = False
        if found:
            return f"{package}.asgi.application"
    return None


def load_asgi_application(path: str | None = None):
    """The application at `path` (default `asgi_application_path()`); without one, Django's
    HTTP application with the live pages' websockets (approvals.live.routing
    .live_application). With DEBUG on, static files are served as `runserver` serves them,
    unless WhiteNoise's middleware (or the application itself) does already."""
    from approvals.live.routing import live_application, with_static_files

    path = path or asgi_application_path()
    application = import_string(path) if path else live_application()
    return with_static_files(application)


def settings_env(host: str, allowed_hosts: list[str]) -> dict[str, str]:
    """The variables settings must be loaded with for this bind: empty when they already fit."""
    if not hasattr(settings, "TOOLNEXUS_HOST"):
        return {}  # settings that do not follow the bind (a host project's own): as they are
    loaded_for = os.environ.get("TOOLNEXUS_HOST") or "127.0.0.1"
    wanted = {}
    if host != loaded_for and not (is_loopback(host) and is_loopback(loaded_for)):
        wanted["TOOLNEXUS_HOST"] = host
    missing = [name for name in allowed_hosts if name not in settings.ALLOWED_HOSTS]
    if missing:
        wanted["TOOLNEXUS_ALLOWED_HOSTS"] = ",".join(
            [*env_list("TOOLNEXUS_ALLOWED_HOSTS"), *missing]
        )
    return wanted


def secret_key_source() -> str:
    """Where settings.SECRET_KEY came from, as serve says it at start."""
    if not hasattr(settings, "TOOLNEXUS_SECRET_KEY_FILE"):
        return "the project's SECRET_KEY setting"  # settings that are not the demo project's
    if os.environ.get("DJANGO_SECRET_KEY"):
        return "DJANGO_SECRET_KEY"
    path = settings.TOOLNEXUS_SECRET_KEY_FILE
    return str(path) if path else "random, this process only"


class Command(BaseCommand):
    help = (
        "Serve the project's ASGI application with an in-process worker (demo project: applies "
        "migrations and prints demo accounts)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--host",
            default=os.environ.get("TOOLNEXUS_HOST", "127.0.0.1"),
            help="address to listen on (default 127.0.0.1; anything else turns DEBUG off, "
            "see the warning it prints)",
        )
        parser.add_argument(
            "--port", type=int, default=int(os.environ.get("TOOLNEXUS_PORT", "8000"))
        )
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="serve only; run db_worker processes separately",
        )
        demo = parser.add_mutually_exclusive_group()
        demo.add_argument(
            "--demo-accounts",
            dest="demo_accounts",
            action="store_true",
            default=None,
            help="create the demo accounts and print their password (the default on "
            "loopback; on any other bind reviewers only, never the admin superuser)",
        )
        demo.add_argument(
            "--no-demo-accounts",
            dest="demo_accounts",
            action="store_false",
            help="do not create or print the demo accounts",
        )
        parser.add_argument(
            "--allow-demo-superuser",
            action="store_true",
            help="serve on a non-loopback bind although a demo superuser (`admin`) made by an "
            "earlier loopback start is active (refused otherwise: its password was printed)",
        )
        parser.add_argument(
            "--allowed-host",
            action="append",
            default=[],
            metavar="NAME",
            help="another Host name to accept (repeatable; the bind's own names are accepted)",
        )

    def run_from_argv(self, argv):
        self._from_command_line = True
        super().run_from_argv(argv)

    def handle(
        self,
        *,
        host,
        port,
        no_worker,
        demo_accounts,
        allowed_host,
        allow_demo_superuser,
        **options,
    ):
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        from approvals.execution.worker import Worker, delivery_workers, start_on_daphne
        from approvals.management.head_deadline import limit_request_heads

        allowed = [
            name.strip() for item in allowed_host for name in item.split(",") if name.strip()
        ]
        wanted = settings_env(host, allowed)
        if wanted:
            self._reload_settings(wanted)
        plan = plan_exposure(host, demo_accounts=demo_accounts, debug=settings.DEBUG)

        if app_settings.SERVE_MIGRATE:
            call_command("migrate", interactive=False, verbosity=0)
        else:
            self.check_migrations()  # says so when some are not applied (`manage.py migrate`)
        refuse_demo_superusers(plan, port, allowed=allow_demo_superuser)
        self.stdout.write(
            f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]} ({settings.DATABASES['default']['NAME']})"
        )
        self.stdout.write(
            f"live push: {settings.CHANNEL_LAYERS['default']['BACKEND'].rsplit('.', 1)[-1]}"
        )
        self.stdout.write(f"secret key: {secret_key_source()}")
        self._static_files(plan, no_worker)
        if plan.demo_accounts:
            password = os.environ.get("TOOLNEXUS_DEMO_PASSWORD") or secrets.token_urlsafe(9)
            made = make_demo_accounts(plan, password)
            for username, role in made:
                self.stdout.write(f"demo account: {username} / {password}  ({role})")
            self._note_foreign_accounts(plan, [name for name, _ in made])
        if app_settings.DEMO_AGENT:
            self._demo_rules()
        if not plan.loopback:
            self._warn_exposed(plan, port)
        worker = None if no_worker else Worker()
        deliveries = [] if no_worker else delivery_workers()
        if worker is not None:
            self.stdout.write("worker: in-process, on the server's event loop (and webhooks)")
        # Loaded after collectstatic: WhiteNoise indexes STATIC_ROOT when the app is built.
        application_path = asgi_application_path()
        application = load_asgi_application(application_path)
        self._say_application(application_path, application)

        self.stdout.write(self.style.SUCCESS(f"serving on http://{host}:{port}/  (Ctrl+C to stop)"))

        def ready() -> None:
            from twisted.internet import defer, reactor  # daphne's, installed by now

            # In the reactor's thread, before it runs. The worker runs on the server's loop
            # until shutdown, when it finishes its current step (or that step is cancelled:
            # its checkpoint is where the next start resumes).
            server.http_factory.timeOut = app_settings.HTTP_IDLE_TIMEOUT or None
            limit_request_heads(server.http_factory, app_settings.HTTP_HEADER_TIMEOUT)
            if worker is not None:
                start_on_daphne(worker)
            for delivery in deliveries:
                start_on_daphne(delivery)
            # Pushes the requests queued on this loop reach the other servers' pages before
            # it stops (the worker's own go out when it ends).
            reactor.addSystemEventTrigger(
                "before",
                "shutdown",
                lambda: defer.Deferred.fromFuture(asyncio.ensure_future(events.settle())),
            )

        server = Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            verbosity=0,
            ready_callable=ready,
            # Slow and idle connections are closed (docs/operations.md, "Server timeouts").
            http_timeout=app_settings.HTTP_TIMEOUT or None,
            websocket_connect_timeout=app_settings.WS_CONNECT_TIMEOUT,
            ping_interval=app_settings.WS_PING_INTERVAL,
            ping_timeout=app_settings.WS_PING_TIMEOUT,
        )
        server.run()
        if not server.listening_addresses:
            raise CommandError(f"could not listen on {host}:{port} (see the log above)")

    # -- helpers ---------------------------------------------------------------------------

    def _demo_rules(self) -> None:
        """The demo agent's two example rules, off (made once: a deleted one stays deleted)."""
        from approvals.services.rules import ensure_demo_rules

        try:
            made = ensure_demo_rules()
        except DatabaseError as exc:  # migrations not applied (TOOLNEXUS_SERVE_MIGRATE off)
            self.stderr.write(f"demo rules not made: {exc}")
            return
        for rule in made:
            self.stdout.write(f"demo rule: {rule.name} (off; switch it on at /rules/)")

    def _reload_settings(self, wanted: dict[str, str]) -> None:
        """Run this command again in a process whose settings are loaded for the bind."""
        shown = " ".join(f"{key}={value}" for key, value in wanted.items())
        if not getattr(self, "_from_command_line", False) or os.environ.get(REEXEC_MARK):
            raise CommandError(
                f"settings were loaded for another bind: set {shown} before Django starts"
            )
        self.stdout.write(f"restarting with {shown} (settings depend on the bind)")
        self.stdout.flush()
        sys.stderr.flush()
        os.execve(
            sys.executable,
            [sys.executable, *sys.orig_argv[1:]],
            {**os.environ, **wanted, REEXEC_MARK: "1"},
        )

    def _note_foreign_accounts(self, plan: Exposure, made: list[str]) -> None:
        wanted = [name for name, *_ in DEMO_REVIEWERS] + (["admin"] if plan.demo_superuser else [])
        for username in wanted:
            if username not in made:
                self.stdout.write(
                    f"demo account: {username} exists and was not made by serve: left as it "
                    f"is (its own password; `manage.py changepassword {username}`)"
                )

    def _say_application(self, path: str | None, application) -> None:
        from approvals.live.routing import serves_websockets

        shown = path or "Django's, with the live pages (no ASGI_APPLICATION, no asgi.py found)"
        if path and not getattr(settings, "ASGI_APPLICATION", None):
            shown += " (ASGI_APPLICATION is not set: the asgi.py next to the settings)"
        self.stdout.write(f"application: {shown}")
        if not serves_websockets(application):
            module = (path or "").rpartition(".")[0]
            self.stderr.write(
                self.style.WARNING(
                    f"{path} is Django's own ASGI handler: it refuses websockets, so live pages "
                    f"never update. In {module.replace('.', '/')}.py, append: `from "
                    "approvals.live.routing import live_application` and `application = "
                    "live_application(application)`."
                )
            )

    def _static_files(self, plan: Exposure, no_worker: bool) -> None:
        """DEBUG off serves hashed copies from STATIC_ROOT (WhiteNoise): on a non-loopback
        bind the single-process form collects them at every start (they follow the code);
        separate web processes expect `collectstatic` at deploy time."""
        if settings.DEBUG or "Manifest" not in settings.STORAGES["staticfiles"]["BACKEND"]:
            return
        manifest = Path(settings.STATIC_ROOT) / "staticfiles.json"
        if not plan.loopback and (not no_worker or not manifest.exists()):
            call_command("collectstatic", interactive=False, verbosity=0)
            self.stdout.write(f"static files: collected into {settings.STATIC_ROOT}")
        elif not manifest.exists():
            self.stderr.write(
                self.style.WARNING(
                    f"static files: no {manifest}: run `manage.py collectstatic` "
                    "(with DEBUG off, pages fail without it)"
                )
            )

    def _warn_exposed(self, plan: Exposure, port: int) -> None:
        lines = [
            f"WARNING: listening on {plan.host}:{port}: other machines can connect to this app.",
            f"  DEBUG is off; the secret key is from {secret_key_source()}.",
            f"  Accepted Host names: {', '.join(settings.ALLOWED_HOSTS)} "
            "(more with --allowed-host NAME).",
        ]
        if plan.demo_accounts:
            lines.append(
                "  Demo reviewers only (--demo-accounts): no demo superuser on this bind. "
                "An administrator: `manage.py createsuperuser`."
            )
        else:
            lines.append(
                "  No demo accounts on this bind (--demo-accounts makes the reviewers, never a "
                "superuser). Make your own: `manage.py createsuperuser`."
            )
        User = get_user_model()
        stale = list(
            User.objects.filter(username__in=DEMO_NAMES, is_active=True)
            .exclude(
                username__in=[name for name, *_ in DEMO_REVIEWERS] if plan.demo_accounts else []
            )
            .order_by("username")
            .values_list("username", flat=True)
        )
        if stale:
            lines.append(
                f"  Demo accounts from an earlier loopback start exist ({', '.join(stale)}); "
                "their password was printed then: change it (`manage.py changepassword NAME`) "
                "or deactivate them in the admin."
            )
        if getattr(settings, "SESSION_COOKIE_SECURE", False):
            lines.append(
                "  This server speaks plain HTTP; http:// requests are redirected to https:// "
                "and cookies are Secure: put a TLS proxy in front (DJANGO_SECURE_PROXY_SSL_HEADER; "
                'docs/operations.md, "Security settings"), or on a network you trust set '
                "DJANGO_SECURE_COOKIES=0 for plain HTTP."
            )
        else:
            lines.append(
                "  DJANGO_SECURE_COOKIES=0: passwords and session cookies cross the network "
                "in clear text. Only on a network you trust."
            )
        self.stdout.flush()  # the warning follows what was printed before it
        self.stderr.write(self.style.WARNING("\n".join(lines)))
