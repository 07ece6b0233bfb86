"""OpenTelemetry traces: off unless configured, and then one trace per decision.

Tracing is on when TOOLNEXUS_TRACING is true or OTEL_EXPORTER_OTLP_ENDPOINT (or its
_TRACES_ variant) is set, and OTEL_SDK_DISABLED is not true. `setup()` (the app's ready())
then installs a tracer provider exporting over OTLP/HTTP (configured by the standard OTEL_*
variables; OTEL_SERVICE_NAME defaults to "toolnexus-web") and the official instrumentations
of Django, psycopg, httpx and Redis. Off, nothing here is imported from the SDK and every
helper below is a no-op that costs one check.

A decision reaches the worker through a queued task, not a call, so its trace context is
carried there: `enqueue_context()` opens a short "toolnexus.enqueue" span under the web
request's span and returns its W3C traceparent, which the task stores in its arguments;
the worker's `continued(traceparent)` makes it the parent of the step's spans ("toolnexus.
resume" or "toolnexus.step", then one "toolnexus.model_call" per model turn). Each carries
the run id and the request id (`toolnexus.run_id`, `toolnexus.request_id`); no argument
values, prompts or answers are ever put on a span.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..conf import app_settings

log = logging.getLogger(__name__)

RUN_ID = "toolnexus.run_id"
REQUEST_ID = "toolnexus.request_id"

_propagator = TraceContextTextMapPropagator()  # W3C traceparent, whatever OTEL_PROPAGATORS says


class _State:
    def __init__(self) -> None:
        self.provider: Any = None  # the SDK's TracerProvider while tracing is on
        self.tracer: Any = None
        self.instrumentors: list[Any] = []


_state = _State()


def wanted() -> bool:
    """Whether this process is configured to trace (the settings and environment alone)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(
        app_settings.TRACING
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def enabled() -> bool:
    return _state.tracer is not None


def setup() -> bool:
    """Turn tracing on if configured (once per process); whether it is on."""
    if enabled():
        return True
    if not wanted():
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    configure(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("tracing on: spans are exported over OTLP/HTTP")
    return True


def configure(processor: Any, *, instrument: bool = True) -> Any:
    """Trace with this span processor (tests: a SimpleSpanProcessor over an in-memory
    exporter), instrumenting Django, psycopg, httpx and Redis; returns the provider. Call
    before Django builds its middleware chain (the app's ready() is): the Django
    instrumentation adds a middleware of its own."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    shutdown()
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "toolnexus-web"}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(processor)
    # The global provider can be set once per process: libraries that ask it get the first
    # one; everything instrumented here is handed this provider explicitly.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(provider)
    _state.provider = provider
    _state.tracer = provider.get_tracer("approvals")
    if instrument:
        _instrument(provider)
    return provider


def _instrument(provider: Any) -> None:
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    for instrumentor in (
        DjangoInstrumentor(),
        PsycopgInstrumentor(),  # statements only: capture_parameters stays off (no values)
        HTTPXClientInstrumentor(),
        RedisInstrumentor(),
    ):
        instrumentor.instrument(tracer_provider=provider)
        _state.instrumentors.append(instrumentor)


def shutdown() -> None:
    """Tracing off: the instrumentations removed, the spans so far flushed (tests)."""
    for instrumentor in _state.instrumentors:
        instrumentor.uninstrument()
    _state.instrumentors = []
    if _state.provider is not None:
        _state.provider.shutdown()
    _state.provider = _state.tracer = None


def _ids(run_id: Any = None, request_id: Any = None) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    if run_id is not None:
        attributes[RUN_ID] = int(run_id)
    if request_id:
        attributes[REQUEST_ID] = str(request_id)
    return attributes


def annotate(*, run_id: Any = None, request_id: Any = None) -> None:
    """Put the ids on the span being recorded now (the web request's, in a view)."""
    if not enabled():
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(_ids(run_id, request_id))


def enqueue_context(*, run_id: int, request_id: str = "") -> str:
    """A traceparent for a task queued now, under the current span ("" when tracing is off
    or no trace is being recorded: nothing to continue)."""
    if not enabled() or not trace.get_current_span().get_span_context().is_valid:
        return ""
    with _state.tracer.start_as_current_span(
        "toolnexus.enqueue", attributes=_ids(run_id, request_id)
    ):
        carrier: dict[str, str] = {}
        _propagator.inject(carrier)
    return carrier.get("traceparent", "")


@contextmanager
def continued(traceparent: str) -> Iterator[None]:
    """Spans started in the block continue the trace of `traceparent` (a queued task's)."""
    if not enabled() or not traceparent:
        yield
        return
    token = otel_context.attach(_propagator.extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextmanager
def span(name: str, *, run_id: Any = None, request_id: Any = None) -> Iterator[Any]:
    """A span around the block (None when tracing is off) with the run and request ids."""
    if not enabled():
        yield None
        return
    with _state.tracer.start_as_current_span(name, attributes=_ids(run_id, request_id)) as s:
        yield s


class TracedModel:
    """A model backend whose every turn is a "toolnexus.model_call" span (the engine knows
    nothing of tracing: the app wraps the backend it hands the engine)."""

    def __init__(self, backend: Any, *, model: str, run_id: int, request_id: str = "") -> None:
        self._backend = backend
        self._attributes = {**_ids(run_id, request_id), "gen_ai.request.model": model}

    def __getattr__(self, name: str) -> Any:  # dialect, streams, anything else of its own
        return getattr(self._backend, name)

    async def complete(self, body: Any, emit: Any) -> Any:
        if _state.tracer is None:  # tracing turned off since (tests)
            return await self._backend.complete(body, emit)
        attributes = dict(self._attributes)
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            # The body's own: a team's sub-agent may ask another model on the same backend.
            attributes["gen_ai.request.model"] = body["model"]
        with _state.tracer.start_as_current_span(
            "toolnexus.model_call", attributes=attributes
        ) as s:
            turn = await self._backend.complete(body, emit)
            usage = getattr(turn, "usage", None) or {}
            for key, name in (
                ("prompt_tokens", "gen_ai.usage.input_tokens"),
                ("completion_tokens", "gen_ai.usage.output_tokens"),
            ):
                if isinstance(usage.get(key), int):
                    s.set_attribute(name, usage[key])
            return turn

    async def aclose(self) -> None:
        await self._backend.aclose()


def traced_model(backend: Any, *, model: str, run_id: int, request_id: str = "") -> Any:
    """The backend, its calls traced when tracing is on."""
    if not enabled() or isinstance(backend, TracedModel):
        return backend
    return TracedModel(backend, model=model, run_id=run_id, request_id=request_id)
