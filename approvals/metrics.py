"""The Prometheus metrics the app's processes count as things happen (prometheus-client).

Decisions, resumes and live sockets are counted where they happen; the gauges read from the
database at scrape time (pending requests, queue depth, heartbeats) are built by the
metrics endpoint (`approvals.ops.collector`). With PROMETHEUS_MULTIPROC_DIR set before the
processes start, prometheus-client keeps these values in files there and the endpoint adds
up every process's (docs/operations.md, "Metrics").

Recording never fails the request or task that records: a broken metrics setup (a
PROMETHEUS_MULTIPROC_DIR that is missing or not writable) is logged once per process and the
value is dropped. Labels are bounded: agents are the registered ones, outcomes and deciders
come from the fixed sets below; never a request or run id.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)

# Who made a decision: a person (pages, API, bulk), a decision rule, the expiry of an overdue
# request, or the system otherwise (a host's code deciding without a user).
DECIDED_BY = ("person", "rule", "expiry", "system")
# What a resume came to: finished (the step's outcome was stored: done, pending on the next
# request, incomplete), failed (the run failed, or its outcome could not be stored at all),
# interrupted (handed back to the queue, or taken over by another worker: it runs again).
RESUME_FINISHED = ("done", "pending", "incomplete")
RESUME_FAILED = ("failed", "abandoned")
# The live pages whose sockets are counted.
LIVE_PAGES = ("inbox", "run")
# What became of one attempt to deliver a notification or a webhook, and the channels.
DELIVERY_OUTCOMES = ("delivered", "will retry", "gave up")
NOTIFICATION_CHANNELS = ("email", "chat", "push")

DECISIONS = Counter(
    "toolnexus_decisions",
    "Decisions on requests, by agent, outcome (the request's new state) and who decided.",
    ["agent", "outcome", "decided_by"],
)
DECISION_WAIT = Histogram(
    "toolnexus_decision_wait_seconds",
    "Time from a request's creation to its decision.",
    ["agent", "decided_by"],
    # People take minutes to days, not milliseconds.
    buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400, 259200, 604800),
)
RESUMES_STARTED = Counter(
    "toolnexus_resumes_started",
    "Steps a worker started from a decided request (a resume).",
    ["agent"],
)
RESUMES_FINISHED = Counter(
    "toolnexus_resumes_finished",
    "Resumes whose outcome was stored, by the run's status after it.",
    ["agent", "status"],
)
RESUMES_FAILED = Counter(
    "toolnexus_resumes_failed",
    "Resumes that failed the run, or whose outcome could not be stored.",
    ["agent"],
)
RESUMES_INTERRUPTED = Counter(
    "toolnexus_resumes_interrupted",
    "Resumes handed back to the queue or taken over by another worker (they run again).",
    ["agent"],
)
LIVE_SOCKETS = Gauge(
    "toolnexus_live_sockets",
    "Live pages' websockets open now.",
    ["page"],
    multiprocess_mode="livesum",  # the processes alive now, added up
)

NOTIFICATION_ATTEMPTS = Counter(
    "toolnexus_notification_attempts",
    "Attempts to deliver a reviewer's notification, by channel and outcome (delivered,"
    " retry: failed and queued again, gave_up: failed for the last time).",
    ["channel", "outcome"],
)
WEBHOOK_ATTEMPTS = Counter(
    "toolnexus_webhook_attempts",
    "Attempts to deliver a host webhook, by outcome (delivered, retry, gave_up).",
    ["outcome"],
)

_F = TypeVar("_F", bound=Callable[..., Any])
_failed = threading.Event()  # set once recording has failed in this process


def _safely(record: _F) -> _F:
    @wraps(record)
    def safe(*args: Any, **kwargs: Any) -> None:
        try:
            record(*args, **kwargs)
        except Exception:
            if not _failed.is_set():
                _failed.set()
                log.exception(
                    "recording metrics failed (is PROMETHEUS_MULTIPROC_DIR a writable "
                    "directory?); values are dropped, nothing else is affected"
                )

    return safe  # type: ignore[return-value]


def _bounded(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value in allowed:
        return value
    log.warning("metrics: %s %r is none of %s; counted as 'other'", name, value, allowed)
    return "other"


@_safely
def decision_made(*, agent: str, outcome: str, decided_by: str, waited_seconds: float) -> None:
    """A decision committed. `outcome`: the request's new state; `decided_by`: DECIDED_BY."""
    by = _bounded(decided_by, DECIDED_BY, "decided_by")
    DECISIONS.labels(agent=agent, outcome=outcome, decided_by=by).inc()
    DECISION_WAIT.labels(agent=agent, decided_by=by).observe(max(0.0, waited_seconds))


@_safely
def resume_started(*, agent: str) -> None:
    RESUMES_STARTED.labels(agent=agent).inc()


@_safely
def resume_ended(*, agent: str, outcome: str) -> None:
    """A resume's step ended with the runner's `outcome` (done, pending, failed, requeued...)."""
    if outcome in RESUME_FINISHED:
        RESUMES_FINISHED.labels(agent=agent, status=outcome).inc()
    elif outcome in RESUME_FAILED:
        RESUMES_FAILED.labels(agent=agent).inc()
    else:
        RESUMES_INTERRUPTED.labels(agent=agent).inc()


@_safely
def socket_opened(*, page: str) -> None:
    LIVE_SOCKETS.labels(page=_bounded(page, LIVE_PAGES, "page")).inc()


@_safely
def socket_closed(*, page: str) -> None:
    LIVE_SOCKETS.labels(page=_bounded(page, LIVE_PAGES, "page")).dec()


def _outcome_label(outcome: str) -> str:
    return {"will retry": "retry", "gave up": "gave_up"}.get(
        _bounded(outcome, DELIVERY_OUTCOMES, "outcome"), outcome
    )


@_safely
def notification_attempted(*, channel: str, outcome: str) -> None:
    """One delivery attempt settled: `outcome` is DELIVERY_OUTCOMES' (delivery._record)."""
    NOTIFICATION_ATTEMPTS.labels(
        channel=_bounded(channel, NOTIFICATION_CHANNELS, "channel"),
        outcome=_outcome_label(outcome),
    ).inc()


@_safely
def webhook_attempted(*, outcome: str) -> None:
    WEBHOOK_ATTEMPTS.labels(outcome=_outcome_label(outcome)).inc()
