"""A new project's URLconf with the app but no sign-in page: Django's default LOGIN_URL,
/accounts/login/, is a 404 here (approvals.W001 says so)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("approvals/", include("approvals.urls")),
]
