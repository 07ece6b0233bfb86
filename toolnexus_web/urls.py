from django.contrib import admin
from django.urls import include, path

from approvals.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("approvals.urls")),
]

# API clients get JSON for every error, also for URLs no endpoint matches (e.g. an id with a
# "/" in it); pages keep Django's own.
handler403 = "approvals.views.permission_denied"  # names the missing permission
handler404 = "approvals.views.not_found"
handler500 = "approvals.views.server_error"
