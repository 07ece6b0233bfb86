"""Health and metrics URLs, to include where probes and scrapers look (usually the root):

    path("", include("approvals.ops_urls")),

- `healthz`: the process is up (200, JSON; no database work);
- `readyz`: the database, migrations, channel layer and workers (200 or 503, JSON);
- `metrics`: Prometheus metrics for a bearer token (TOOLNEXUS_METRICS_TOKEN; 404 unset).

None needs a sign-in. They are kept out of `approvals.urls`, whose prefix is the app's
pages: a project mounting the app at /approvals/ still probes /healthz.
"""

from django.urls import path

from .ops import views

urlpatterns = [
    path("healthz", views.healthz, name="toolnexus-healthz"),
    path("readyz", views.readyz, name="toolnexus-readyz"),
    path("metrics", views.metrics, name="toolnexus-metrics"),
]
