"""/metrics (approvals.ops) and the counters behind it (approvals.metrics): the bearer token,
exact values after a scripted set of decisions and resumes, gauges read from the database at
scrape time and held through an outage, live sockets, and a broken multi-process setup that
never fails a request (in subprocesses: prometheus-client picks its mode at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from approvals import metrics, services, testing
from approvals.domain.exceptions import AlreadyDecided
from approvals.domain.records import lock_request, record_decision
from approvals.execution import recovery
from approvals.models import ApprovalRequest, Rule, WorkerHeartbeat
from approvals.ops import collector

from .factories import (
    TIMEOUT,
    drain,
    fresh,
    in_thread,
    make_user,
    open_socket,
    pending_request,
    start_and_halt,
    user_of,
)

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "s3cret-metrics-token"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def token(settings):
    settings.TOOLNEXUS_METRICS_TOKEN = TOKEN
    return TOKEN


@pytest.fixture(autouse=True)
def fresh_held_values(monkeypatch):
    """Each test's scrapes start with nothing held from another test's database."""
    monkeypatch.setattr(collector, "DATABASE", collector.DatabaseCollector())


def scrape(**headers) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one authorised scrape."""
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}", **headers})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Deltas:
    """Counter values now minus at the start (the registry is the process's own)."""

    def __init__(self, *keys: tuple[str, dict]) -> None:
        self.keys = keys
        self.before = [value(name, **labels) for name, labels in keys]

    def now(self) -> list[float]:
        return [value(n, **lb) - b for (n, lb), b in zip(self.keys, self.before, strict=True)]


def decisions(outcome: str, by: str, agent: str = "demo") -> tuple[str, dict]:
    return (
        "toolnexus_decisions_total",
        {"agent": agent, "outcome": outcome, "decided_by": by},
    )


# -- the token -----------------------------------------------------------------------------------


def test_without_a_token_configured_metrics_are_not_there(settings):
    settings.TOOLNEXUS_METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 404
    assert Client().get("/metrics", headers={"Authorization": "Bearer "}).status_code == 404


def test_a_missing_or_wrong_token_is_401_and_the_right_one_is_served(token):
    missing = Client().get("/metrics")
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"].startswith("Bearer")
    for wrong in (f"Bearer {token}x", f"Basic {token}", token, "Bearer"):
        assert Client().get("/metrics", headers={"Authorization": wrong}).status_code == 401
    right = Client().get("/metrics", headers={"Authorization": f"bearer {token}"})
    assert right.status_code == 200
    assert b"toolnexus_metrics_database_up 1.0" in right.content


def test_a_signed_in_superuser_without_the_token_is_refused_too(token):
    client = Client()
    client.force_login(make_user(role="superuser"))
    assert client.get("/metrics").status_code == 401


def test_openmetrics_is_served_when_asked_for(token):
    response = Client().get(
        "/metrics",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/openmetrics-text"},
    )
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.rstrip().endswith(b"# EOF")


# -- a scripted set of decisions and resumes -------------------------------------------------


def test_decisions_and_resumes_are_counted_exactly(token):
    reviewer = make_user()
    runs = [start_and_halt(user=reviewer) for _ in range(6)]
    approved, declined, expired, cancelled, rolled_back, waiting = (
        pending_request(run) for run in runs
    )
    counters = Deltas(
        decisions("approved", "person"),
        decisions("declined", "person"),
        decisions("expired", "expiry"),
        decisions("cancelled", "person"),
        decisions("approved", "rule"),
        ("toolnexus_resumes_started_total", {"agent": "demo"}),
        ("toolnexus_resumes_failed_total", {"agent": "demo"}),
        ("toolnexus_decision_wait_seconds_count", {"agent": "demo", "decided_by": "person"}),
    )
    services.request_approve(request_id=approved.request_id, user=reviewer)
    with pytest.raises(AlreadyDecided):  # nothing is decided (nor counted) twice
        services.request_approve(request_id=approved.request_id, user=reviewer)
    services.request_decline(request_id=declined.request_id, user=reviewer, reason="no")
    recovery.request_expire(request_id=expired.request_id)
    services.run_cancel(run_id=cancelled.run_id, user=reviewer)

    class Undone(Exception):
        pass

    with pytest.raises(Undone), transaction.atomic():  # a decision rolled back never happened
        services.request_approve(request_id=rolled_back.request_id, user=reviewer)
        raise Undone

    assert counters.now() == [1, 1, 1, 1, 0, 0, 0, 3]
    finished = Deltas(
        *(
            ("toolnexus_resumes_finished_total", {"agent": "demo", "status": status})
            for status in metrics.RESUME_FINISHED
        ),
        ("toolnexus_resumes_interrupted_total", {"agent": "demo"}),
    )
    assert drain() == 3  # the approved, declined and expired runs resume; the cancelled not
    assert counters.now() == [1, 1, 1, 1, 0, 3, 0, 3]
    assert finished.now() == [3, 0, 0, 0]  # each demo run ends after its decision

    samples = scrape()
    pending = {
        labels: v for (name, labels), v in samples.items() if name == "toolnexus_pending_requests"
    }
    assert pending == {(("agent", "demo"), ("kind", "tool_call")): 2.0}  # rolled_back, waiting
    assert samples[("toolnexus_task_queue_depth", ())] == 0
    oldest = samples[("toolnexus_oldest_pending_request_age_seconds", (("agent", "demo"),))]
    assert 0 <= oldest < 120
    assert fresh(runs[5]).status == "pending" and waiting.state == "pending"


def test_a_resume_that_fails_the_run_is_counted_as_failed(mock_model, token):
    user = make_user()
    run = services.run_start(agent="remote", prompt="refund B-7", started_by=user)
    drain()
    request = fresh(run).requests.get()
    counters = Deltas(
        ("toolnexus_resumes_started_total", {"agent": "remote"}),
        ("toolnexus_resumes_failed_total", {"agent": "remote"}),
    )
    services.request_decline(request_id=request.request_id, user=user, reason="policy")
    mock_model.fail = True
    drain()
    assert fresh(run).status == "failed"
    assert counters.now() == [1, 1]


def test_a_rule_decision_is_counted_as_decided_by_rule():
    run = start_and_halt()
    counters = Deltas(decisions("approved", "rule"), decisions("approved", "system"))
    with transaction.atomic():
        row = lock_request(pending_request(run).request_id)
        record_decision(row, None, ApprovalRequest.State.APPROVED, None, "", decider="rule")
    assert counters.now() == [1, 0]


def test_the_decision_wait_histogram_observes_the_time_since_the_request_was_made():
    run = start_and_halt()
    row = pending_request(run)
    ApprovalRequest.objects.filter(pk=row.pk).update(
        created_at=timezone.now() - timedelta(minutes=20)
    )
    labels = {"agent": "demo", "decided_by": "person"}
    under_ten = Deltas(("toolnexus_decision_wait_seconds_bucket", {**labels, "le": "600.0"}))
    under_thirty = Deltas(("toolnexus_decision_wait_seconds_bucket", {**labels, "le": "1800.0"}))
    services.request_approve(request_id=row.request_id, user=make_user())
    assert under_ten.now() == [0]
    assert under_thirty.now() == [1]


def test_an_unknown_decider_is_counted_as_other_not_a_new_label_value():
    before = value("toolnexus_decisions_total", agent="demo", outcome="approved", decided_by="x")
    metrics.decision_made(agent="demo", outcome="approved", decided_by="x", waited_seconds=1)
    assert value("toolnexus_decisions_total", agent="demo", outcome="approved", decided_by="x") == (
        before
    )


# -- gauges read at scrape time ------------------------------------------------------------------


def test_workers_and_their_heartbeat_age_are_scraped(token):
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        worker_id="w-1", host="h", pid=1, started_at=now, beat_at=now - timedelta(seconds=4)
    )
    WorkerHeartbeat.objects.create(
        worker_id="w-2", host="h", pid=2, started_at=now, beat_at=now - timedelta(seconds=400)
    )
    samples = scrape()
    assert samples[("toolnexus_workers_alive", ())] == 1
    assert 4 <= samples[("toolnexus_worker_heartbeat_age_seconds", ())] < 60


def test_a_scrape_during_a_database_outage_answers_with_the_last_values(token, monkeypatch):
    start_and_halt()
    first = scrape()
    key = ("toolnexus_pending_requests", (("agent", "demo"), ("kind", "tool_call")))
    assert first[key] == 1 and first[("toolnexus_metrics_database_up", ())] == 1

    def down(*args, **kwargs):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(collector, "read_database", down)
    during = scrape()
    assert during[("toolnexus_metrics_database_up", ())] == 0
    assert during[key] == 1  # held
    read_at = ("toolnexus_metrics_database_read_timestamp_seconds", ())
    assert during[read_at] == first[read_at]


def test_a_database_that_hangs_does_not_hold_the_scrape(token, settings, monkeypatch):
    settings.TOOLNEXUS_METRICS_DB_TIMEOUT = 0.3
    release = threading.Event()
    monkeypatch.setattr(collector, "read_database", lambda *a: release.wait(30))
    try:
        started = time.monotonic()
        samples = scrape()
        took = time.monotonic() - started
    finally:
        release.set()
    assert took < 2
    assert samples[("toolnexus_metrics_database_up", ())] == 0
    assert ("toolnexus_pending_requests", ()) not in samples  # nothing held yet: nothing made up


# -- live sockets --------------------------------------------------------------------------------


async def test_live_sockets_are_counted_while_open(in_memory_layer):
    watcher = await user_of("watcher")
    run = await in_thread(start_and_halt)
    inbox = ("toolnexus_live_sockets", {"page": "inbox"})
    run_page = ("toolnexus_live_sockets", {"page": "run"})
    opened = Deltas(inbox, run_page)
    inbox_socket, _ = await open_socket("/ws/inbox/", watcher)
    run_socket, _ = await open_socket(f"/ws/runs/{run.pk}/", watcher)
    assert opened.now() == [1, 1]
    await inbox_socket.disconnect(timeout=TIMEOUT)
    await run_socket.disconnect(timeout=TIMEOUT)
    assert opened.now() == [0, 0]


async def test_a_refused_socket_is_not_counted(in_memory_layer):
    from .factories import communicator

    inbox = Deltas(("toolnexus_live_sockets", {"page": "inbox"}))
    comm = await communicator("/ws/inbox/")  # anonymous
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert not connected
    assert inbox.now() == [0]


# -- multi-process mode (subprocesses: the mode is chosen when prometheus-client is imported) --

RECORD = """
import django, os, sys
django.setup()
from approvals import metrics
for _ in range(int(sys.argv[1])):
    metrics.decision_made(agent="demo", outcome="approved", decided_by="person", waited_seconds=3)
metrics.resume_started(agent="demo")
print("recorded")
"""

SCRAPE = """
import django, json
django.setup()
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
response = Client().get("/metrics", headers={"Authorization": "Bearer t"})
print(json.dumps({"status": response.status_code, "body": response.content.decode()}))
"""


def in_subprocess(code: str, *args: str, multiproc_dir: str, tmp_path: Path) -> str:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "toolnexus_web.settings",
        "PROMETHEUS_MULTIPROC_DIR": multiproc_dir,
        "TOOLNEXUS_METRICS_TOKEN": "t",
        "TOOLNEXUS_SQLITE_PATH": str(tmp_path / "unmigrated.sqlite3"),
        "TOOLNEXUS_METRICS_DB_TIMEOUT": "1",
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_multi_process_mode_adds_up_every_process(tmp_path):
    shared = tmp_path / "prometheus"
    shared.mkdir()
    assert in_subprocess(RECORD, "2", multiproc_dir=str(shared), tmp_path=tmp_path) == "recorded"
    assert in_subprocess(RECORD, "3", multiproc_dir=str(shared), tmp_path=tmp_path) == "recorded"
    answer = json.loads(in_subprocess(SCRAPE, multiproc_dir=str(shared), tmp_path=tmp_path))
    assert answer["status"] == 200
    body = answer["body"]
    assert (
        'toolnexus_decisions_total{agent="demo",decided_by="person",outcome="approved"} 5.0' in body
    )
    assert 'toolnexus_resumes_started_total{agent="demo"} 2.0' in body
    assert "toolnexus_metrics_multiprocess_up 1.0" in body
    # The scraping process's database has no tables: the scrape says so and still answers.
    assert "toolnexus_metrics_database_up 0.0" in body


def test_a_missing_multi_process_directory_never_fails_a_request(tmp_path):
    missing = str(tmp_path / "not-there")
    assert in_subprocess(RECORD, "1", multiproc_dir=missing, tmp_path=tmp_path) == "recorded"
    answer = json.loads(in_subprocess(SCRAPE, multiproc_dir=missing, tmp_path=tmp_path))
    assert answer["status"] == 200
    assert "toolnexus_metrics_multiprocess_up 0.0" in answer["body"]


def test_a_call_a_rule_decides_in_the_worker_is_counted_as_decided_by_rule():
    Rule.objects.create(name="small refunds", effect=Rule.Effect.APPROVE, tool="refund")
    counters = Deltas(decisions("approved", "rule"), decisions("approved", "person"))
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.status == "done", run.error
    assert counters.now() == [1, 0]


# -- deliveries ----------------------------------------------------------------------------------


def test_notification_and_webhook_attempts_are_counted_by_outcome(settings, token):
    from approvals.execution import notifications, webhooks
    from approvals.models import (
        NotificationDelivery,
        NotificationPreference,
        WebhookDelivery,
        WebhookSubscription,
    )

    settings.TOOLNEXUS_NOTIFICATIONS = True
    settings.TOOLNEXUS_EVENTS_SETTLE_SECONDS = 0
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.TOOLNEXUS_WEBHOOK_MAX_ATTEMPTS = 2
    settings.TOOLNEXUS_WEBHOOK_TIMEOUT_SECONDS = 2
    testing.deliver_webhooks()  # nothing from before
    reviewer = make_user()
    reviewer.email = "rita@example.test"
    reviewer.save()
    NotificationPreference.objects.create(user=reviewer, email_enabled=True)
    refused = WebhookSubscription(url="http://127.0.0.1:9/hook", event_types=["request.created"])
    services.webhook_subscribe(refused)  # nothing listens there
    counted = Deltas(
        ("toolnexus_notification_attempts_total", {"channel": "email", "outcome": "delivered"}),
        ("toolnexus_webhook_attempts_total", {"outcome": "retry"}),
        ("toolnexus_webhook_attempts_total", {"outcome": "gave_up"}),
        ("toolnexus_webhook_attempts_total", {"outcome": "delivered"}),
    )
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert NotificationDelivery.objects.get().state == "delivered"
    hook = WebhookDelivery.objects.get()
    assert counted.now() == [1, 1, 0, 0]
    webhooks.attempt(hook.pk)  # its second and last attempt, refused again
    assert counted.now() == [1, 1, 1, 0]
    assert notifications.attempt(NotificationDelivery.objects.get().pk) == "nothing to send"
    assert counted.now() == [1, 1, 1, 0]  # nothing counted for an attempt never made
    samples = scrape()
    key = ("toolnexus_webhook_attempts_total", (("outcome", "gave_up"),))
    assert samples[key] >= 1
