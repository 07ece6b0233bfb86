"""The app's settings, in one namespace with defaults: every `TOOLNEXUS_*` name the app reads.

    from approvals.conf import app_settings

    app_settings.RUN_LEASE_SECONDS  # settings.TOOLNEXUS_RUN_LEASE_SECONDS, else 30

A host project sets only the names it wants to change; everything else has the default
below. Values are read from django.conf.settings on every access, so `override_settings`
and pytest-django's `settings` fixture apply at once.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings

PREFIX = "TOOLNEXUS_"

# The task queue of webhook deliveries (TASKS' QUEUES must name it; checks.W003).
WEBHOOK_QUEUE = "webhooks"

DEFAULTS: dict[str, Any] = {
    # -- agents ----------------------------------------------------------------------------
    # Extra modules that register agents (besides every installed app's agents.py).
    "AGENT_MODULES": (),
    # The offline demo agent: opt-in (this repository's demo project turns it on).
    "DEMO_AGENT": False,
    # -- pages -------------------------------------------------------------------------------
    # The template the app's pages sit in: a full HTML page with the blocks `title`, `head`
    # (inside <head>: the app adds its stylesheet and scripts) and `content`. The default is
    # a minimal page the app ships.
    "BASE_TEMPLATE": "approvals/page.html",
    # -- the worker --------------------------------------------------------------------------
    # A running run's lease, renewed by its worker's heartbeat every third of it.
    "RUN_LEASE_SECONDS": 30,
    # How often a worker expires overdue requests and recovers abandoned runs.
    "MAINTENANCE_SECONDS": 10.0,
    # How long a task row that ended well is kept. 0: removed as it ends, in the step's
    # outcome transaction, so the queue's table holds what is ready or running (its claim
    # query never walks finished rows); more: kept finished, pruned by maintenance after
    # this long (an audit of every task, as the fault suite counts them).
    "KEEP_FINISHED_TASKS_SECONDS": 0,
    # How often an idle worker looks for new tasks.
    "WORKER_INTERVAL": 0.2,
    # Default expiry for requests that carry no expiresAt (0: never).
    "REQUEST_TTL_SECONDS": 0,
    # A run's page shows the model's reply as it is generated (False: only the stored
    # transcript, once the turn ends); pushed to the page at most once per
    # STREAM_BATCH_SECONDS, with the reply so far.
    "STREAM_REPLIES": True,
    "STREAM_BATCH_SECONDS": 0.15,
    # The demo agent's model "generates" its replies word by word, this many seconds apart,
    # while a reply streams (0: the text at once).
    "DEMO_WORD_SECONDS": 0.03,
    # -- `manage.py serve` -------------------------------------------------------------------
    # Server timeouts (docs/operations.md, "Server timeouts"); 0: none.
    "HTTP_TIMEOUT": 60.0,
    "HTTP_IDLE_TIMEOUT": 60.0,
    "HTTP_HEADER_TIMEOUT": 30.0,
    "WS_CONNECT_TIMEOUT": 10.0,
    "WS_PING_INTERVAL": 20.0,
    "WS_PING_TIMEOUT": 30.0,
    # `serve` applies migrations before it starts (the demo project: on).
    "SERVE_MIGRATE": False,
    # `serve` on a loopback address makes the demo accounts (the demo project: on).
    "DEMO_ACCOUNTS": False,
    # -- limits and throttles ----------------------------------------------------------------
    # Live pages (websockets) one account may hold open at once (0: no cap).
    "MAX_SOCKETS_PER_USER": 30,
    # Proxies in front of the app whose X-Forwarded-For entries are believed.
    "TRUSTED_PROXIES": 0,
    # API throttles, "N/unit" ("" turns one off).
    "API_TOKEN_RATE": "600/min",
    "API_USER_RATE": "1200/min",
    "API_AUTH_FAILURE_RATE": "30/min",
    # Runs one user may start per minute (0: no cap).
    "RUNS_PER_MINUTE": 30,
    # A new API token's lifetime in days (0: never expires).
    "TOKEN_DAYS": 90,
    # Whoever started a run may not approve or answer its requests, for every agent.
    "STARTER_CANNOT_APPROVE": False,
    # -- host events (`/api/events`, webhooks) -----------------------------------------------
    # An audit row is handed to hosts this many seconds after it was written (event_feed).
    "EVENTS_SETTLE_SECONDS": 1.0,
    # How often an open event stream looks for new events, and sends a keep-alive comment.
    "EVENTS_POLL_SECONDS": 1.0,
    "EVENTS_KEEPALIVE_SECONDS": 15.0,
    # An event stream ends after this many seconds (the client reconnects with
    # Last-Event-ID and loses nothing); keep it below HTTP_TIMEOUT, which would cut it.
    "EVENTS_STREAM_SECONDS": 50.0,
    # A webhook POST's timeout (for its whole answer, however it trickles in), and the
    # attempts before a delivery is given up (the waits between attempts grow: 10 s, 30 s,
    # 1.5 min, ... up to an hour).
    "WEBHOOK_TIMEOUT_SECONDS": 10.0,
    "WEBHOOK_MAX_ATTEMPTS": 8,
    # How often the delivery worker turns new events into deliveries.
    "WEBHOOK_DISPATCH_SECONDS": 1.0,
    # Delivery workers beside a run worker (serve, db_worker): a slow receiver holds one of
    # them for up to its timeout, never every delivery. None: 4 on PostgreSQL, 1 on SQLite
    # (whose writers take turns anyway: more would only queue on its lock).
    "WEBHOOK_WORKERS": None,
    # -- reviewers' notifications (email, chat through apprise) ------------------------------
    # Off unless set: no preference is read and nothing is sent.
    "NOTIFICATIONS": False,
    # The app's public address, for the links in messages (e.g. https://approvals.example.com).
    "PUBLIC_BASE_URL": "http://127.0.0.1:8000",
    # The apprise URL schemes a reviewer may use for chat (anything else is refused at save).
    "NOTIFICATION_CHAT_SCHEMES": (
        "json",
        "jsons",
        "form",
        "forms",
        "slack",
        "discord",
        "msteams",
        "matrix",
        "matrixs",
        "mmost",
        "mmosts",
        "rocket",
        "rockets",
        "ntfy",
        "ntfys",
        "gotify",
        "gotifys",
        "tgram",
    ),
    # A message's attempts before it is given up (waits grow: 10 s, 30 s, 1.5 min, ...), and
    # each chat attempt's timeout.
    "NOTIFICATION_MAX_ATTEMPTS": 6,
    "NOTIFICATION_TIMEOUT_SECONDS": 10.0,
    # A request still pending this long after it arrived is overdue (for "only overdue").
    "NOTIFICATION_OVERDUE_MINUTES": 60,
    # An email's Approve / Decline links work once, within this many hours.
    "NOTIFICATION_LINK_HOURS": 24,
    # Web Push (`manage.py vapid_keys` makes a pair): offered only when both keys are set.
    # The public key is the browser's applicationServerKey, the private one signs each push
    # (VAPID); the subject (mailto: or https:) tells push services whom to contact.
    "VAPID_PUBLIC_KEY": "",
    "VAPID_PRIVATE_KEY": "",
    "VAPID_SUBJECT": "",
    # How long a push service keeps a push for a device that is offline (seconds).
    "PUSH_TTL_SECONDS": 12 * 3600,
    # -- Slack: a team channel's interactive Approve / Decline (README, "Slack") ------------
    # Off unless all three are set: the bot's token (scope chat:write), the app's signing
    # secret (its actions are refused without it) and the channel id new requests go to.
    "SLACK_BOT_TOKEN": "",
    "SLACK_SIGNING_SECRET": "",
    "SLACK_CHANNEL": "",
    # Slack's Web API (tests point it at a stub on loopback).
    "SLACK_API_URL": "https://slack.com/api/",
    # The workspace id (T...) whose actions are taken; empty: the one the app is installed in.
    "SLACK_TEAM_ID": "",
    # -- triage ------------------------------------------------------------------------------
    # Minutes a reviewer's claim on a request lasts ("I am on it"; 0: until released).
    "CLAIM_MINUTES": 30,
    # The inbox counts rows up to this many and then reads "1000+": an exact count reads
    # every matching row, so a page's cost would grow with the backlog.
    "INBOX_COUNT_CAP": 1000,
    # A live inbox of every pending request shares one pending count per change; its chips'
    # counts (claimed by me, unclaimed...) are the viewer's own, so each such page counts
    # them at most once per this many seconds, after the change (0: after every change).
    "LIVE_CHIP_SECONDS": 5.0,
    # -- health and metrics (docs/operations.md, "Health and metrics") ------------------------
    # Seconds each /readyz check (database and migrations, channel layer, worker) may take;
    # the checks run side by side, so /readyz answers within about this long.
    "READY_TIMEOUT": 3.0,
    # /readyz wants a worker's heartbeat within this many seconds (0: no worker check, for a
    # deployment whose servers must stay ready while no worker runs).
    "READY_WORKER_SECONDS": 60,
    # The bearer token /metrics asks for; unset, /metrics answers 404.
    "METRICS_TOKEN": "",
    # Seconds a scrape may spend reading the database; past it, the last values read.
    "METRICS_DB_TIMEOUT": 2.0,
    # -- traces and logs (docs/operations.md, "Traces and logs") -----------------------------
    # OpenTelemetry traces exported over OTLP/HTTP (the standard OTEL_* variables configure
    # the exporter); also on when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    "TRACING": False,
    # -- the team dashboard (/reports/) ------------------------------------------------------
    # Seconds a period's figures are kept (per set of agents the viewer may see) before the
    # database is read again: the figures scan every decision of the period, a cost that grows
    # with it, and a dashboard a minute old tells the same story (0: read at every view).
    "REPORTS_CACHE_SECONDS": 60,
}


class AppSettings:
    """`app_settings.NAME` is `settings.TOOLNEXUS_NAME`, or its default."""

    def __getattr__(self, name: str) -> Any:
        try:
            default = DEFAULTS[name]
        except KeyError:
            raise AttributeError(f"the app has no setting {PREFIX}{name}") from None
        return getattr(settings, PREFIX + name, default)

    def __dir__(self) -> list[str]:
        return sorted(DEFAULTS)


app_settings = AppSettings()


def setting_name(name: str) -> str:
    """The Django setting that holds `name` ("RUN_LEASE_SECONDS" -> "TOOLNEXUS_RUN_...")."""
    if name not in DEFAULTS:
        raise KeyError(name)
    return PREFIX + name


def install_defaults() -> list[str]:
    """Give django.conf.settings the default of every TOOLNEXUS_* name the project left out,
    for the modules that still read `settings.TOOLNEXUS_*` directly (the worker in
    approvals/execution, db_worker, the websocket consumers, serve's server options). Called
    once from the app's ready(); returns the names it filled in. Modules that read
    `app_settings` need none of this."""
    filled = []
    for name, default in DEFAULTS.items():
        full = PREFIX + name
        if not hasattr(settings, full):
            setattr(settings, full, default)
            filled.append(full)
    return filled


def is_loopback(host: str) -> bool:
    """Whether a bind address (or host name) reaches only this machine."""
    host = host.strip().strip("[]").lower()
    if host in ("localhost", "ip6-localhost", "ip6-loopback") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
