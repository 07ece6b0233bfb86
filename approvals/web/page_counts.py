"""The counts of the inbox page an htmx answer came from, for the answers that change them
(a snooze, an ignore, an un-hide, a claim, a release): every count of the page at once, from
the same presenter and partials as its list's, so none of them stays behind."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.http import HttpRequest, QueryDict
from django.template.loader import render_to_string
from django.urls import reverse

from ..presenters import pages


def page_counts_html(request: HttpRequest) -> str:
    """Every count of the inbox page this htmx request came from (its URL's filters), out of
    band; "" for any other page (a request's own page shows none)."""
    current = request.htmx.current_url if request.htmx else None
    if not current:
        return ""
    url = urlsplit(current)
    if url.path != reverse("approvals:inbox"):
        return ""
    context = pages.page_counts(request.user, QueryDict(url.query))
    return render_to_string("approvals/inbox.html#counts-update", context, request=request)
