"""Where the app is mounted: the JSON API's prefix, read from the URLconf (a project includes
`approvals.urls` at any prefix), so the request guards and error pages answer API clients
with JSON wherever the API lives."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest
from django.urls import NoReverseMatch, get_script_prefix, get_urlconf, reverse

API_ROOT = "approvals:toolnexus_api:api-root"


@lru_cache(maxsize=32)
def _api_prefix(urlconf, script_prefix: str) -> str | None:
    try:
        return reverse(API_ROOT, urlconf=urlconf)
    except NoReverseMatch:
        return None


def api_prefix() -> str | None:
    """The API's path prefix in this request's URLconf (the demo project: "/api/"), or None
    when the API is not mounted."""
    return _api_prefix(get_urlconf() or settings.ROOT_URLCONF, get_script_prefix())


def is_api_request(request: HttpRequest) -> bool:
    prefix = api_prefix()
    return prefix is not None and request.path.startswith(prefix)
