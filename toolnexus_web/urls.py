from django.contrib import admin
from django.urls import include, path

from approvals.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("approvals.urls")),
]
