"""Workers' signs of life (`WorkerHeartbeat`): what /readyz, the metrics and the admin read to
tell whether any worker is running."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..models import WorkerHeartbeat

# A stopped or vanished worker's row is kept this long (the admin shows recent history).
KEEP_STOPPED = timedelta(days=1)


def worker_beat(*, worker_id: str, started_at: datetime) -> None:
    """Record that this worker is alive now (one UPDATE; the first beat INSERTs its row)."""
    now = timezone.now()
    updated = WorkerHeartbeat.objects.filter(worker_id=worker_id).update(
        beat_at=now, stopped_at=None
    )
    if updated:
        return
    try:
        with transaction.atomic():
            WorkerHeartbeat.objects.create(
                worker_id=worker_id,
                host=socket.gethostname()[:255],
                pid=os.getpid(),
                started_at=started_at,
                beat_at=now,
            )
    except IntegrityError:  # written meanwhile (the same id restarted): it is alive now
        WorkerHeartbeat.objects.filter(worker_id=worker_id).update(beat_at=now, stopped_at=None)


def worker_stopped(*, worker_id: str) -> None:
    """The worker stopped cleanly: its row stays (the admin shows it) but no longer counts."""
    WorkerHeartbeat.objects.filter(worker_id=worker_id).update(stopped_at=timezone.now())


def heartbeats_prune(*, now: datetime | None = None) -> int:
    """Forget workers that have not beaten for a day."""
    before = (now or timezone.now()) - KEEP_STOPPED
    deleted, _ = WorkerHeartbeat.objects.filter(beat_at__lt=before).delete()
    return deleted
