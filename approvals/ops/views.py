"""The health and metrics endpoints. No sign-in: probes and scrapers have no session; /metrics
asks for its own bearer token (TOOLNEXUS_METRICS_TOKEN) and is not there without one."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from ..conf import app_settings
from . import collector, health


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and answers requests (no database work)."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """Every dependency answers: 200, or 503 naming what failed (`health.readiness`)."""
    readiness = health.readiness()
    return JsonResponse(readiness.as_json(), status=200 if readiness.ok else 503)


def _bearer(request: HttpRequest) -> str:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition, for `Authorization: Bearer <TOOLNEXUS_METRICS_TOKEN>`."""
    token = app_settings.METRICS_TOKEN
    if not token:
        raise Http404("metrics are off: set TOOLNEXUS_METRICS_TOKEN")
    if not constant_time_compare(_bearer(request), token):
        refused = HttpResponse(
            "metrics need the bearer token (Authorization: Bearer ...)\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        refused["WWW-Authenticate"] = 'Bearer realm="toolnexus metrics"'
        return refused
    body, content_type = collector.scrape(request.headers.get("Accept"))
    return HttpResponse(body, content_type=content_type)
