from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # Health probes and Prometheus metrics: /healthz, /readyz, /metrics (no sign-in).
    path("", include("approvals.ops_urls")),
    # The app's sign-in and sign-out pages; Django's for the rest (password change).
    path("accounts/", include("approvals.auth_urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    # The app at the root: pages at /, the API at /api/, the live pages' sockets at /ws/.
    path("", include("approvals.urls")),
]

# The app answers its own errors (JSON under the API, its 403 page); these cover the rest of
# the project the same way (admin and sign-in pages, URLs outside the app).
handler403 = "approvals.web.views.permission_denied"  # names the missing permission
handler404 = "approvals.web.views.not_found"
handler500 = "approvals.web.views.server_error"
