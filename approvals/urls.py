"""The app's URLs, to include at any prefix of a project's URLconf:

    path("approvals/", include("approvals.urls")),

- the pages at the prefix (the inbox, runs, requests; namespace `approvals`),
- the JSON API under `api/` (namespace `approvals:toolnexus_api`; every answer JSON, an
  unknown URL under it too),
- the live pages' websockets under `ws/` as named URLs (`approvals:live-inbox`,
  `approvals:live-run`): templates reverse them, and the ASGI side routes the same paths
  (`approvals.live.routing.websocket_urlpatterns`).
"""

from django.urls import path, re_path

from .api import api
from .web import urls as pages
from .web import views

app_name = "approvals"

urlpatterns = [
    path("api/", api.urls),
    re_path(r"^api/", views.api_not_found, name="api-not-found"),
    path("ws/inbox/", views.websocket_only, name="live-inbox"),
    path("ws/runs/<int:run_id>/", views.websocket_only, name="live-run"),
    *pages.urlpatterns,
]
