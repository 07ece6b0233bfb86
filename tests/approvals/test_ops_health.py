"""/healthz and /readyz (approvals.ops) and the workers' heartbeats they read: no sign-in,
JSON naming each check, 503 naming what failed, and an answer within the checks' deadline
when a dependency hangs (a Redis that accepts and never answers)."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client
from django.utils import timezone

from approvals.execution import heartbeats
from approvals.models import WorkerHeartbeat
from approvals.ops import health

from .factories import make_user, serving, wait_until

# The checks read the database from threads of their own: the test's rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


def beat(worker_id: str = "w-1", *, seconds_ago: float = 0, stopped: bool = False) -> None:
    at = timezone.now() - timedelta(seconds=seconds_ago)
    WorkerHeartbeat.objects.create(
        worker_id=worker_id,
        host="box",
        pid=4242,
        started_at=at - timedelta(minutes=5),
        beat_at=at,
        stopped_at=at if stopped else None,
    )


def ready(client: Client | None = None):
    response = (client or Client()).get("/readyz")
    assert response["Content-Type"] == "application/json"
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]
    return response.status_code, response.json()


def redis_layer(port: int) -> dict:
    return {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{port}/0"}]},
        }
    }


# -- /healthz ----------------------------------------------------------------------------------


def test_healthz_answers_without_sign_in_or_database_work(django_assert_num_queries):
    with django_assert_num_queries(0):
        response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_health_endpoints_take_only_get_and_head():
    assert Client().post("/healthz").status_code == 405
    assert Client().head("/healthz").status_code == 200
    assert Client().post("/readyz").status_code == 405


def test_health_probes_over_plain_http_are_not_redirected_to_https(settings):
    # The demo's production settings redirect to HTTPS; a probe inside a cluster speaks HTTP.
    settings.SECURE_SSL_REDIRECT = True
    beat()
    assert Client().get("/healthz").status_code == 200
    assert Client().get("/readyz").status_code == 200
    assert Client().get("/").status_code == 301  # the rest of the site still is


# -- /readyz -----------------------------------------------------------------------------------


def test_readyz_is_ready_with_the_database_migrated_and_a_fresh_heartbeat(settings):
    in_memory = "InMemory" in settings.CHANNEL_LAYERS["default"]["BACKEND"]
    beat(seconds_ago=5)
    status, body = ready()
    assert status == 200, body
    assert body["status"] == "ok"
    assert body["failed"] == []
    assert list(body["checks"]) == ["database", "migrations", "channel_layer", "worker"]
    assert all(check["ok"] for check in body["checks"].values())
    assert body["checks"]["worker"]["workers"] == 1
    if in_memory:
        assert "skipped" in body["checks"]["channel_layer"]
    else:  # REDIS_URL set: the layer's Redis answered a PING
        assert body["checks"]["channel_layer"]["hosts"] == 1


def test_readyz_needs_no_sign_in_even_when_the_app_asks_for_it():
    beat()
    client = Client()
    assert client.get("/").status_code == 302  # the inbox sends anonymous users to sign in
    assert ready(client)[0] == 200


def test_a_stale_heartbeat_is_503_naming_the_worker_check(settings):
    settings.TOOLNEXUS_READY_WORKER_SECONDS = 60
    beat("w-old", seconds_ago=75)
    status, body = ready()
    assert status == 503
    assert body["status"] == "unavailable"
    assert body["failed"] == ["worker"]
    error = body["checks"]["worker"]["error"]
    assert "within 60 s" in error and "w-old" in error and "75 s old" in error
    assert body["checks"]["database"]["ok"] and body["checks"]["migrations"]["ok"]


def test_no_worker_at_all_or_only_stopped_ones_is_503():
    assert ready()[1]["failed"] == ["worker"]
    beat("w-stopped", stopped=True)
    status, body = ready()
    assert status == 503
    assert "no worker is running" in body["checks"]["worker"]["error"]


def test_the_worker_check_can_be_turned_off(settings):
    settings.TOOLNEXUS_READY_WORKER_SECONDS = 0
    status, body = ready()
    assert status == 200
    assert "skipped" in body["checks"]["worker"]


def test_unapplied_migrations_are_503_naming_them():
    recorder = MigrationRecorder(connection)
    # The newest: an older one marked unapplied under an applied one is not in the plan.
    (newest,) = MigrationLoader(connection).graph.leaf_nodes("approvals")
    recorder.record_unapplied(*newest)
    try:
        beat()
        status, body = ready()
    finally:
        recorder.record_applied(*newest)
    assert status == 503
    assert body["failed"] == ["migrations"]
    assert f"approvals.{newest[1]}" in body["checks"]["migrations"]["error"]


def test_redis_on_a_closed_port_is_503_naming_the_channel_layer(settings):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]  # nothing listens once it is closed
    settings.CHANNEL_LAYERS = redis_layer(closed_port)
    beat()
    started = time.monotonic()
    status, body = ready()
    assert time.monotonic() - started < settings.TOOLNEXUS_READY_TIMEOUT + 1
    assert status == 503
    assert body["failed"] == ["channel_layer"]
    assert "ConnectionError" in body["checks"]["channel_layer"]["error"]


def test_a_redis_that_never_answers_is_reported_within_the_timeout(settings):
    # A server that accepts connections (the kernel's backlog does) and never replies.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        settings.CHANNEL_LAYERS = redis_layer(silent.getsockname()[1])
        settings.TOOLNEXUS_READY_TIMEOUT = 1.0
        beat()
        started = time.monotonic()
        status, body = ready()
        took = time.monotonic() - started
    assert took < 2.5
    assert status == 503
    assert body["failed"] == ["channel_layer"]


def test_a_reachable_redis_layer_passes(settings):
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
    except OSError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    settings.CHANNEL_LAYERS = redis_layer(6379)
    beat()
    status, body = ready()
    assert status == 200, body
    assert body["checks"]["channel_layer"]["hosts"] == 1


def test_a_database_check_that_hangs_is_reported_within_the_timeout(settings, monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(health, "_database_checks", lambda results, timeout: release.wait(30))
    settings.TOOLNEXUS_READY_TIMEOUT = 0.5
    try:
        started = time.monotonic()
        status, body = ready()
        took = time.monotonic() - started
    finally:
        release.set()
    assert took < 2
    assert status == 503
    assert body["failed"] == ["database", "migrations", "worker"]
    assert body["checks"]["database"]["error"] == "no answer within 0.5 s"
    assert body["checks"]["channel_layer"]["ok"]


# -- the heartbeats ------------------------------------------------------------------------------


def test_a_serving_worker_beats_and_its_row_says_when_it_stopped():
    with serving() as (worker, _loop):
        row = wait_until(
            lambda: WorkerHeartbeat.objects.filter(worker_id=worker.worker_id).first(),
            "the worker's first heartbeat",
        )
        assert row.stopped_at is None
        assert row.host == socket.gethostname()
        assert ready()[0] == 200
    row.refresh_from_db()
    assert row.stopped_at is not None
    status, body = ready()
    assert status == 503 and body["failed"] == ["worker"]


def test_a_beat_updates_the_row_and_old_rows_are_pruned():
    started = timezone.now()
    heartbeats.worker_beat(worker_id="w-1", started_at=started)
    first = WorkerHeartbeat.objects.get(worker_id="w-1").beat_at
    heartbeats.worker_stopped(worker_id="w-1")
    heartbeats.worker_beat(worker_id="w-1", started_at=started)  # the same id again
    row = WorkerHeartbeat.objects.get(worker_id="w-1")
    assert row.beat_at >= first and row.stopped_at is None
    beat("w-gone", seconds_ago=2 * 86_400)
    assert heartbeats.heartbeats_prune() == 1
    assert list(WorkerHeartbeat.objects.values_list("worker_id", flat=True)) == ["w-1"]


def test_the_admin_lists_the_heartbeats():
    beat("w-admin", seconds_ago=3)
    beat("w-silent", seconds_ago=600)
    client = Client()
    client.force_login(make_user(role="superuser"))
    page = client.get("/admin/approvals/workerheartbeat/").content.decode()
    assert "w-admin" in page and "running" in page
    assert "w-silent" in page and "silent (gone?)" in page
    assert client.get("/admin/approvals/workerheartbeat/add/").status_code == 403
