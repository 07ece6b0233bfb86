"""What every page of the app's shares: rendering inside the project's base template, the
safe "next" URL a form returns to, and the confirmation step of an irreversible action."""

from __future__ import annotations

from django.http import (
    HttpRequest,
    HttpResponse,
)
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from ..conf import app_settings


def render_page(
    request: HttpRequest, template: str, context: dict | None = None, status: int = 200
) -> HttpResponse:
    """`render`, with the template the app's pages sit in (TOOLNEXUS_BASE_TEMPLATE, which
    approvals/base.html extends)."""
    context = {"approvals_base_template": app_settings.BASE_TEMPLATE, **(context or {})}
    return render(request, template, context, status=status)


def next_url(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return reverse("approvals:inbox")


def confirm_page(
    request: HttpRequest, *, title: str, detail: str, action: str, button: str, back: str = ""
) -> HttpResponse:
    """The confirmation step of an irreversible action, for forms posted without it (no
    JavaScript; with htmx the button's hx-confirm asked already and posts `confirmed`)."""
    context = {
        "title": title,
        "detail": detail,
        "action": action,
        "button": button,
        "fields": [
            (k, v)
            for k in request.POST
            if k not in ("csrfmiddlewaretoken", "confirmed")
            for v in request.POST.getlist(k)
        ],
        "back": back or next_url(request),
    }
    return render_page(request, "approvals/confirm.html", context)
