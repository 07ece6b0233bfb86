"""The sign-in and sign-out pages the app ships (`approvals.auth_urls`), for a project that
has none: Django's own LoginView and LogoutView, in the app's page frame."""

from __future__ import annotations

from typing import Any

from django.conf import global_settings, settings
from django.contrib.auth import views as auth_views
from django.urls import NoReverseMatch, reverse

from ..conf import app_settings


class _AppFrame:
    """The app's pages sit in TOOLNEXUS_BASE_TEMPLATE (approvals/base.html extends it)."""

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)  # type: ignore[misc]
        context["approvals_base_template"] = app_settings.BASE_TEMPLATE
        return context


class SignInView(_AppFrame, auth_views.LoginView):
    template_name = "approvals/login.html"

    def get_default_redirect_url(self) -> str:
        # Without ?next=, Django goes to LOGIN_REDIRECT_URL, whose default /accounts/profile/
        # is a page no new project has: the inbox instead, unless the project chose a page.
        if settings.LOGIN_REDIRECT_URL == global_settings.LOGIN_REDIRECT_URL:
            try:
                return reverse("approvals:inbox")
            except NoReverseMatch:
                pass  # the app's URLs are not included (approvals.E006 says so)
        return super().get_default_redirect_url()


class SignOutView(_AppFrame, auth_views.LogoutView):
    # Shown when the project sets no LOGOUT_REDIRECT_URL.
    template_name = "approvals/signed_out.html"
