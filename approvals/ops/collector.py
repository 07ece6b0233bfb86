"""What /metrics answers: the counters every process keeps (`approvals.metrics`, added up
across processes in multi-process mode) and gauges read from the database at scrape time.

The database read is bounded (TOOLNEXUS_METRICS_DB_TIMEOUT, and statement_timeout on
PostgreSQL). When it fails or does not answer in time, the scrape still answers: with the
last values this process read, `toolnexus_metrics_database_up 0`, and
`toolnexus_metrics_database_read_timestamp_seconds` saying how old they are. Ages (of the
oldest pending request, of the newest heartbeat) are worked out at scrape time from the
held timestamps, so they keep growing through an outage.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Count, Min
from django.utils import timezone
from django_tasks_db.models import DBTaskResult
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from ..conf import app_settings
from ..models import ApprovalRequest, WorkerHeartbeat
from . import bounded

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True)
class Reading:
    """One read of the database's gauges."""

    pending: list[tuple[str, str, int]]  # (agent, kind, count)
    oldest_pending: dict[str, datetime]  # agent -> created_at of its oldest pending request
    ready_tasks: int
    workers_alive: int
    newest_beat: datetime | None
    read_at: float  # unix time


def read_database(window_seconds: float, timeout: float) -> Reading:
    """The gauges' values, every statement bounded by `timeout` on PostgreSQL."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [str(int(timeout * 1000))]
                )
        groups = list(
            ApprovalRequest.objects.filter(state=ApprovalRequest.State.PENDING)
            .order_by()
            .values_list("agent", "kind")
            .annotate(count=Count("id"), oldest=Min("created_at"))
        )
        ready_tasks = DBTaskResult.objects.ready().count()
        running = WorkerHeartbeat.objects.filter(stopped_at__isnull=True)
        newest_beat = running.order_by("-beat_at").values_list("beat_at", flat=True).first()
        alive = running.filter(
            beat_at__gte=timezone.now() - timedelta(seconds=window_seconds)
        ).count()
    oldest: dict[str, datetime] = {}
    for agent, _kind, _count, created in groups:
        if agent not in oldest or created < oldest[agent]:
            oldest[agent] = created
    return Reading(
        pending=[(agent, kind, count) for agent, kind, count, _ in groups],
        oldest_pending=oldest,
        ready_tasks=ready_tasks,
        workers_alive=alive,
        newest_beat=newest_beat,
        read_at=time.time(),
    )


class DatabaseCollector:
    """The scrape-time gauges; keeps the last good reading of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Reading | None = None
        self._reading: Future[Reading] | None = None  # a read still on its way

    def _read(self) -> tuple[Reading | None, bool]:
        timeout = float(app_settings.METRICS_DB_TIMEOUT)
        window = float(app_settings.READY_WORKER_SECONDS) or 60.0
        with self._lock:
            # One read at a time: scrapes during a hung read wait on it, never pile threads up.
            if self._reading is None or self._reading.done():
                self._reading = bounded.submit(lambda: read_database(window, timeout))
            reading = self._reading
        try:
            fresh = reading.result(timeout=timeout)
        except FutureTimeout:
            log.warning("metrics: the database did not answer within %g s", timeout)
            return self._held, False
        except Exception as exc:
            log.warning("metrics: reading the database failed: %s", exc)
            return self._held, False
        with self._lock:
            self._held = fresh
        return fresh, True

    def collect(self) -> Iterator[Metric]:
        reading, up = self._read()
        database_up = GaugeMetricFamily(
            "toolnexus_metrics_database_up",
            "Whether this scrape read the database (0: the values below are the last read).",
        )
        database_up.add_metric([], 1 if up else 0)
        yield database_up
        if reading is None:
            return
        read_at = GaugeMetricFamily(
            "toolnexus_metrics_database_read_timestamp_seconds",
            "When the database values of this scrape were read (unix time).",
        )
        read_at.add_metric([], reading.read_at)
        yield read_at
        now = timezone.now()
        pending = GaugeMetricFamily(
            "toolnexus_pending_requests",
            "Requests waiting for a decision, by agent and kind.",
            labels=["agent", "kind"],
        )
        for agent, kind, count in reading.pending:
            pending.add_metric([agent, kind], count)
        yield pending
        oldest = GaugeMetricFamily(
            "toolnexus_oldest_pending_request_age_seconds",
            "How long the oldest pending request of each agent has waited.",
            labels=["agent"],
        )
        for agent, created in sorted(reading.oldest_pending.items()):
            oldest.add_metric([agent], max(0.0, (now - created).total_seconds()))
        yield oldest
        queue = GaugeMetricFamily(
            "toolnexus_task_queue_depth", "Task rows ready to run (waiting for a worker)."
        )
        queue.add_metric([], reading.ready_tasks)
        yield queue
        alive = GaugeMetricFamily(
            "toolnexus_workers_alive",
            "Workers that have beaten within TOOLNEXUS_READY_WORKER_SECONDS (60 s if 0).",
        )
        alive.add_metric([], reading.workers_alive)
        yield alive
        if reading.newest_beat is not None:
            beat = GaugeMetricFamily(
                "toolnexus_worker_heartbeat_age_seconds",
                "Age of the newest heartbeat of any running worker.",
            )
            beat.add_metric([], max(0.0, (now - reading.newest_beat).total_seconds()))
            yield beat


DATABASE = DatabaseCollector()


class _Scrape:
    """The sources of one scrape, each collected on its own: one that fails (a corrupt
    multi-process file) is logged and left out, never the whole answer."""

    def __init__(self, sources: Iterable, multiprocess_up: int | None) -> None:
        self.sources = list(sources)
        self.multiprocess_up = multiprocess_up

    def collect(self) -> Iterator[Metric]:
        if self.multiprocess_up is not None:
            up = GaugeMetricFamily(
                "toolnexus_metrics_multiprocess_up",
                f"Whether the counters of every process could be read from {MULTIPROC_ENV}.",
            )
            up.add_metric([], self.multiprocess_up)
            yield up
        for source in self.sources:
            try:
                collected = list(source.collect())
            except Exception:
                log.exception("metrics: a collector failed; its metrics are left out")
                continue
            yield from collected


def scrape(accept: str | None) -> tuple[bytes, str]:
    """The exposition for one scrape, in the format `accept` asks for (Prometheus text or
    OpenMetrics), and its content type."""
    multiproc_dir = os.environ.get(MULTIPROC_ENV)
    multiprocess_up = None
    if multiproc_dir:
        # Every process writes its values into files there; add them all up.
        registry = CollectorRegistry()
        try:
            MultiProcessCollector(registry, path=multiproc_dir)
            multiprocess_up = 1
        except Exception as exc:
            log.warning("metrics: %s=%s cannot be read: %s", MULTIPROC_ENV, multiproc_dir, exc)
            multiprocess_up = 0
        sources = [registry, DATABASE]
    else:
        sources = [REGISTRY, DATABASE]
    encoder, content_type = choose_encoder(accept or "")
    return encoder(_Scrape(sources, multiprocess_up)), content_type
