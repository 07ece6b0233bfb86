"""A new project's URLconf (`startproject`'s admin) with the README's lines: the app under
/approvals/ and its sign-in pages under /accounts/."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("approvals.auth_urls")),
    path("approvals/", include("approvals.urls")),
]
