from django.contrib import admin
from django.urls import include, path

from approvals.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("approvals.web.urls")),
]

# API clients get JSON for every error, also for URLs no endpoint matches (e.g. an id with a
# "/" in it); pages keep Django's own.
handler403 = "approvals.web.views.permission_denied"  # names the missing permission
handler404 = "approvals.web.views.not_found"
handler500 = "approvals.web.views.server_error"
