"""Readiness: whether this process can do its work now (/readyz).

Each check answers within TOOLNEXUS_READY_TIMEOUT seconds or is reported as not answering:
the database (a round trip), its migrations (none left to apply), the channel layer (a
Redis PING, when a Redis layer is configured) and the workers (one has beaten within
TOOLNEXUS_READY_WORKER_SECONDS). The database's three run one after the other in one
thread, Redis's in another, both at once; on PostgreSQL each statement is also bounded by
the server (statement_timeout), and Redis by its socket timeouts.
"""

from __future__ import annotations

import time
from concurrent.futures import wait
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from ..conf import app_settings
from ..models import WorkerHeartbeat
from . import bounded

CHECKS = ("database", "migrations", "channel_layer", "worker")


@dataclass
class Readiness:
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        return [name for name in CHECKS if not self.checks[name]["ok"]]

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_json(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.ok else "unavailable",
            "failed": self.failed,
            "checks": self.checks,
        }


def _passed(started: float, **extra: Any) -> dict[str, Any]:
    return {"ok": True, "seconds": round(time.monotonic() - started, 4), **extra}


def _failed(started: float, error: str) -> dict[str, Any]:
    return {"ok": False, "error": error, "seconds": round(time.monotonic() - started, 4)}


def _problem(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# -- the database, its migrations, the workers ---------------------------------------------


def _bound_statements(connection, timeout: float) -> None:
    """Inside a transaction on PostgreSQL: the server cancels a statement past `timeout`."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)", [str(int(timeout * 1000))]
            )


def _database_checks(results: dict[str, dict[str, Any]], timeout: float) -> None:
    connection = connections[DEFAULT_DB_ALIAS]
    started = time.monotonic()
    try:
        with transaction.atomic():
            _bound_statements(connection, timeout)
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.fetchone()
    except Exception as exc:
        results["database"] = _failed(started, _problem(exc))
        skipped = "not checked: the database did not answer"
        results["migrations"] = {"ok": False, "error": skipped}
        results["worker"] = {"ok": False, "error": skipped}
        return
    results["database"] = _passed(started, vendor=connection.vendor)

    started = time.monotonic()
    try:
        with transaction.atomic():
            _bound_statements(connection, timeout)
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:
        results["migrations"] = _failed(started, _problem(exc))
    else:
        if plan:
            names = [f"{m.app_label}.{m.name}" for m, _ in plan]
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            results["migrations"] = _failed(started, f"{len(names)} not applied: {shown}")
        else:
            results["migrations"] = _passed(started)

    results["worker"] = _worker_check(connection, timeout)


def _worker_check(connection, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    window = float(app_settings.READY_WORKER_SECONDS)
    if window <= 0:
        return _passed(started, skipped="TOOLNEXUS_READY_WORKER_SECONDS is 0")
    try:
        with transaction.atomic():
            _bound_statements(connection, timeout)
            newest = (
                WorkerHeartbeat.objects.filter(stopped_at__isnull=True)
                .order_by("-beat_at")
                .values("worker_id", "host", "pid", "beat_at")
                .first()
            )
    except Exception as exc:
        return _failed(started, _problem(exc))
    if newest is None:
        return _failed(started, "no worker is running (none has ever beaten, or all stopped)")
    age = (timezone.now() - newest["beat_at"]).total_seconds()
    if age > window:
        return _failed(
            started,
            f"no worker has beaten within {window:g} s: the newest beat, of worker "
            f"{newest['worker_id']} on {newest['host']} (pid {newest['pid']}), is "
            f"{age:.0f} s old",
        )
    alive = WorkerHeartbeat.objects.filter(
        stopped_at__isnull=True, beat_at__gte=timezone.now() - timedelta(seconds=window)
    ).count()
    return _passed(started, workers=alive, newest_beat_seconds=round(age, 1))


# -- the channel layer ---------------------------------------------------------------------


def redis_hosts() -> list[dict[str, Any]] | None:
    """The Redis hosts of the default channel layer (channels-redis's own reading of its
    config), or None when the layer is not a Redis one."""
    layer = getattr(settings, "CHANNEL_LAYERS", {}).get("default") or {}
    if not str(layer.get("BACKEND", "")).startswith("channels_redis."):
        return None
    from channels_redis.utils import decode_hosts

    return decode_hosts((layer.get("CONFIG") or {}).get("hosts"))


def _ping(host: dict[str, Any], timeout: float) -> None:
    """PING one host as channels-redis would connect to it, every wait bounded by timeout."""
    import redis
    from redis.sentinel import Sentinel

    host = dict(host)
    host.update(socket_timeout=timeout, socket_connect_timeout=timeout, retry_on_timeout=False)
    host.pop("health_check_interval", None)
    if "address" in host:
        client = redis.Redis.from_url(host.pop("address"), **host)
    elif host.get("master_name") is not None:
        name, sentinels = host.pop("master_name"), host.pop("sentinels")
        sentinel_kwargs = {
            **(host.pop("sentinel_kwargs", None) or {}),
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
        }
        client = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs).master_for(name, **host)
    else:
        client = redis.Redis(**host)
    try:
        client.ping()
    finally:
        client.close()


def _channel_layer_check(timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    try:
        hosts = redis_hosts()
        if hosts is None:
            return _passed(started, skipped="not a Redis channel layer (nothing to reach)")
        for host in hosts:
            _ping(host, timeout)
    except Exception as exc:
        return _failed(started, _problem(exc))
    return _passed(started, hosts=len(hosts))


# -- all of them ---------------------------------------------------------------------------


def readiness(timeout: float | None = None) -> Readiness:
    """Run every check at once; whatever has not answered within `timeout` (default
    TOOLNEXUS_READY_TIMEOUT) is reported as not answering."""
    timeout = float(app_settings.READY_TIMEOUT if timeout is None else timeout)
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    database = bounded.submit(lambda: _database_checks(results, timeout))
    layer = bounded.submit(lambda: _channel_layer_check(timeout))
    wait([database, layer], timeout=timeout)
    late = f"no answer within {timeout:g} s"
    checks = dict(results)  # a copy: a late answer must not change what was reported
    if layer.done() and layer.exception() is None:
        checks["channel_layer"] = layer.result()
    else:
        layer.cancel()
        checks["channel_layer"] = _failed(started, late)
    if not database.done():
        database.cancel()
    for name in ("database", "migrations", "worker"):
        if name not in checks:
            checks[name] = _failed(started, late if name == "database" else "not checked: " + late)
    return Readiness({name: checks[name] for name in CHECKS})
