"""Traces and logs (approvals.telemetry): a decision's web request, its queued resume, the
worker's step and the model call are one trace carrying the run and request ids; log lines
about a run or request name it, and the user, in JSON when asked; text lines are unchanged."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import runpy
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.test import AsyncClient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import toolnexus_web.settings
from approvals import services
from approvals.models import ApprovalRequest
from approvals.telemetry import logs, tracing
from approvals.telemetry.logs import ContextFilter, JsonFormatter, check_format

from .factories import (
    bearer,
    drain,
    fresh,
    make_user,
    post_json,
    session_client,
    start_and_halt,
    tasks_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans():
    """Tracing on for one test, its spans kept in memory; off (uninstrumented) after it."""
    exporter = InMemorySpanExporter()
    tracing.configure(SimpleSpanProcessor(exporter))
    yield exporter
    tracing.shutdown()


def _pending(run) -> ApprovalRequest:
    return run.requests.get(state=ApprovalRequest.State.PENDING)


def _one_named(finished, name):
    found = [s for s in finished if s.name == name]
    assert len(found) == 1, [s.name for s in finished]
    return found[0]


def test_a_decision_its_resume_and_the_model_call_are_one_trace_with_the_ids(spans):
    run = start_and_halt()
    row = _pending(run)
    spans.clear()  # the first step's spans: not what this test follows
    reviewer = make_user()
    response = session_client(reviewer).post(
        f"/requests/{row.request_id}/decline/", {"reason": "over the limit"}
    )
    assert response.status_code in (200, 302)
    (task,) = [t for t in tasks_for(run) if t.status == "READY"]
    assert task.args_kwargs["kwargs"]["traceparent"].startswith("00-")
    assert drain() == 1
    assert fresh(run).status == "done"

    finished = spans.get_finished_spans()
    web = [s for s in finished if s.kind == SpanKind.SERVER]
    assert len(web) == 1 and web[0].attributes["toolnexus.request_id"] == row.request_id
    enqueued = _one_named(finished, "toolnexus.enqueue")
    resume = _one_named(finished, "toolnexus.resume")
    model_calls = [s for s in finished if s.name == "toolnexus.model_call"]
    assert model_calls
    trace_id = web[0].context.trace_id
    for span in [enqueued, resume, *model_calls]:
        assert span.context.trace_id == trace_id
        assert span.attributes["toolnexus.run_id"] == run.pk
        assert span.attributes["toolnexus.request_id"] == row.request_id
    # web request -> enqueue (in the request) -> resume (in the worker) -> model call
    assert enqueued.parent.span_id == web[0].context.span_id
    assert resume.parent.span_id == enqueued.context.span_id
    assert all(s.parent.span_id == resume.context.span_id for s in model_calls)
    assert resume.attributes["toolnexus.outcome"] == "done"
    assert all(s.attributes["gen_ai.request.model"] for s in model_calls)
    # No argument value, reason or prompt on any span.
    text = json.dumps([dict(s.attributes or {}) for s in finished])
    assert "A-1001" not in text and "over the limit" not in text


def test_an_api_decision_continues_into_the_worker_too(spans):
    run = start_and_halt()
    row = _pending(run)
    spans.clear()
    client = session_client()
    response = post_json(
        client,
        f"/api/requests/{row.request_id}/decline",
        {"reason": "no"},
        headers=bearer(make_user()),
    )
    assert response.status_code == 200, response.content
    drain()
    finished = spans.get_finished_spans()
    (web,) = [s for s in finished if s.kind == SpanKind.SERVER]
    resume = _one_named(finished, "toolnexus.resume")
    assert resume.context.trace_id == web.context.trace_id
    assert web.attributes["toolnexus.request_id"] == row.request_id


def test_over_asgi_as_served_the_decision_is_traced_into_the_worker(spans):
    run = start_and_halt()
    row = _pending(run)
    spans.clear()
    client, headers = AsyncClient(), bearer(make_user())
    response = async_to_sync(client.post)(
        f"/api/requests/{row.request_id}/decline",
        data={"reason": "no"},
        content_type="application/json",
        headers=headers,
    )
    assert response.status_code == 200, response.content
    drain()
    finished = spans.get_finished_spans()
    (web,) = [s for s in finished if s.kind == SpanKind.SERVER]
    assert web.attributes["toolnexus.request_id"] == row.request_id
    resume = _one_named(finished, "toolnexus.resume")
    assert resume.context.trace_id == web.context.trace_id


def test_without_tracing_tasks_keep_their_arguments_and_no_span_is_made():
    assert not tracing.enabled()
    run = start_and_halt()
    row = _pending(run)
    session_client(make_user()).post(f"/requests/{row.request_id}/decline/", {"reason": "no"})
    (task,) = [t for t in tasks_for(run) if t.status == "READY"]
    assert task.args_kwargs == {"args": [run.pk], "kwargs": {}}
    assert drain() == 1 and fresh(run).status == "done"


def test_tracing_is_wanted_only_when_configured(monkeypatch, settings):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    settings.TOOLNEXUS_TRACING = False
    assert not tracing.wanted()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert tracing.wanted()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.wanted()
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    settings.TOOLNEXUS_TRACING = True
    assert tracing.wanted()


# -- logs -------------------------------------------------------------------------------------


@pytest.fixture
def json_lines():
    """The app's loggers written as JSON into a buffer (as TOOLNEXUS_LOG_FORMAT=json does)."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("approvals")
    logger.addHandler(handler)
    try:
        yield lambda: [json.loads(line) for line in buffer.getvalue().splitlines()]
    finally:
        logger.removeHandler(handler)


def test_json_lines_name_the_run_the_request_and_the_user(json_lines):
    run = start_and_halt()
    row = _pending(run)
    reviewer = make_user()
    session_client(reviewer).post(
        f"/requests/{row.request_id}/decline/", {"reason": "secret reason"}
    )
    (decided,) = [line for line in json_lines() if "queued to resume" in line["message"]]
    assert decided["request_id"] == row.request_id
    assert decided["run_id"] == run.pk
    assert decided["user"] == reviewer.get_username()
    assert decided["user_id"] == reviewer.pk
    assert decided["level"] == "INFO" and decided["logger"] == "approvals.services.requests"
    assert "time" in decided

    drain()
    (ended,) = [
        line for line in json_lines() if line["message"] == f"run {run.pk}: step ended done"
    ]
    assert (ended["run_id"], ended["request_id"]) == (run.pk, row.request_id)
    assert ended["user_id"] == reviewer.pk  # who decided what the worker resumed
    # Nothing a reviewer typed or a call carried: no reason, no argument values.
    everything = json.dumps(json_lines())
    assert "secret reason" not in everything and "A-1001" not in everything


def test_a_decision_rolled_back_is_never_logged_as_made(json_lines):
    row = _pending(start_and_halt())
    with pytest.raises(RuntimeError), transaction.atomic():
        services.request_decline(request_id=row.request_id, user=make_user(), reason="no")
        raise RuntimeError("the rest of the request failed")
    assert not [line for line in json_lines() if "queued to resume" in line["message"]]
    services.request_decline(request_id=row.request_id, user=make_user(), reason="no")
    assert [line for line in json_lines() if "queued to resume" in line["message"]]


def test_an_api_callers_token_names_the_user(json_lines):
    run = start_and_halt()
    row = _pending(run)
    reviewer = make_user()
    post_json(
        session_client(),
        f"/api/requests/{row.request_id}/decline",
        {"reason": "no"},
        headers=bearer(reviewer),
    )
    (decided,) = [line for line in json_lines() if "queued to resume" in line["message"]]
    assert decided["user"] == reviewer.get_username()
    assert decided["request_id"] == row.request_id


def test_the_context_ends_with_its_block_and_lines_outside_carry_none(json_lines):
    log = logging.getLogger("approvals.test")
    with logs.bound(run_id=7, request_id="r-1"):
        log.warning("inside")
    log.warning("outside")
    inside, outside = json_lines()
    assert (inside["run_id"], inside["request_id"]) == (7, "r-1")
    assert "run_id" not in outside and "request_id" not in outside
    with pytest.raises(TypeError):
        logs.bind(arguments={"card": "4111"})
    logs.bind(user="ann")  # outside any scope: nothing stays behind for later lines
    assert logs.current() == {}
    with logs.scope():
        logs.bind(user="ann", request_id="")
        assert logs.current() == {"user": "ann"}
    assert logs.current() == {}


def test_text_logs_are_the_message_alone_by_default(settings):
    """The project's LOGGING with the default format: a line reads as before, the context
    notwithstanding."""
    assert settings.TOOLNEXUS_LOG_FORMAT == "text"
    handler_config = settings.LOGGING["handlers"]["console"]
    assert "formatter" not in handler_config
    buffer = io.StringIO()
    logging.config.dictConfig(
        {**settings.LOGGING, "handlers": {"console": {**handler_config, "stream": buffer}}}
    )
    try:
        with logs.bound(run_id=3, request_id="r-9", user="ann"):
            logging.getLogger("approvals.test").warning("run %s: something", 3)
    finally:
        logging.config.dictConfig(settings.LOGGING)
    assert buffer.getvalue() == "run 3: something\n"


def test_the_projects_json_format_writes_the_app_and_djangos_lines_as_json(monkeypatch, settings):
    """TOOLNEXUS_LOG_FORMAT=json as the demo project reads it (its settings run anew)."""
    monkeypatch.setenv("TOOLNEXUS_LOG_FORMAT", "json")
    project = runpy.run_path(str(Path(toolnexus_web.settings.__file__)))
    assert project["TOOLNEXUS_LOG_FORMAT"] == "json"
    config = project["LOGGING"]
    buffer = io.StringIO()
    console = {**config["handlers"]["console"], "stream": buffer}
    logging.config.dictConfig({**config, "handlers": {"console": console}})
    try:
        with logs.bound(run_id=3, request_id="r-9", user="ann"):
            logging.getLogger("approvals.test").info("run %s: something", 3)
        logging.getLogger("django.security.csrf").warning("Forbidden (CSRF cookie not set.)")
    finally:
        logging.config.dictConfig(settings.LOGGING)
    app_line, django_line = (json.loads(line) for line in buffer.getvalue().splitlines())
    assert app_line["message"] == "run 3: something" and app_line["level"] == "INFO"
    assert (app_line["run_id"], app_line["request_id"], app_line["user"]) == (3, "r-9", "ann")
    assert django_line["logger"] == "django.security.csrf"


def test_a_wrong_log_format_is_refused_clearly():
    assert check_format("JSON") == "json" and check_format("") == "text"
    with pytest.raises(ValueError, match="TOOLNEXUS_LOG_FORMAT must be text or json, not 'xml'"):
        check_format("xml")
