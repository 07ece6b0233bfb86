"""The project's 404 and 500 pages (handler404 / handler500: approvals.web.views.not_found and
server_error): readable on a phone (a viewport), styled like the app, a way back to the inbox,
JSON under the API. The 500 page renders when what usually breaks is broken: the database,
the session, the static files' manifest."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from django.contrib.staticfiles.storage import staticfiles_storage
from django.db import connections
from django.test import Client, RequestFactory
from django.utils.functional import SimpleLazyObject

from approvals.web import errors, views

from .factories import make_user, session_client

VIEWPORT = '<meta name="viewport" content="width=device-width, initial-scale=1">'
BACK_TO_INBOX = '<a href="/">Back to the inbox</a>'


@pytest.mark.django_db
def test_a_missing_page_is_the_apps_404_page(settings):
    settings.DEBUG = False
    response = Client().get("/nope/")
    assert response.status_code == 404
    assert "approvals/404.html" in [t.name for t in response.templates]
    html = response.content.decode()
    assert VIEWPORT in html
    assert "/static/approvals/app.css" in html
    assert "<h1>Page not found</h1>" in html
    assert "nothing at this address" in html
    assert BACK_TO_INBOX in html
    assert 'style="' not in html and "<style" not in html  # the CSP allows no inline style


@pytest.mark.django_db
def test_a_signed_in_reviewer_gets_the_404_page_with_the_apps_header(settings):
    settings.DEBUG = False
    reviewer = make_user(role="reviewer")
    response = session_client(reviewer).get("/runs/nope/")
    assert response.status_code == 404
    html = response.content.decode()
    assert VIEWPORT in html and BACK_TO_INBOX in html
    assert reviewer.get_username() in html  # the header, as on every page of the app


@pytest.mark.django_db
def test_a_missing_api_endpoint_still_answers_json(settings):
    settings.DEBUG = False
    factory = RequestFactory()
    for path in ("/api/nope", "/api/nope/deeper/"):
        response = Client().get(path)
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert json.loads(response.content) == {"detail": "Not Found: no endpoint at this URL"}
        # the handler itself, whatever URL pattern answered above
        direct = views.not_found(factory.get(path), Exception("no such URL"))
        assert direct.status_code == 404 and direct["Content-Type"] == "application/json"


def _server_error(path: str = "/runs/1/"):
    return views.server_error(RequestFactory().get(path))


def test_the_500_page_is_readable_on_a_phone_and_finds_its_way_back():
    response = _server_error()
    assert response.status_code == 500
    html = response.content.decode()
    assert VIEWPORT in html
    assert '<meta name="color-scheme" content="light dark">' in html  # dark mode, even unstyled
    assert "/static/approvals/app.css" in html
    assert "Something went wrong" in html
    assert BACK_TO_INBOX in html
    assert 'style="' not in html and "<style" not in html and "<script" not in html


def test_the_500_page_under_the_api_is_json():
    response = _server_error("/api/runs/1")
    assert response.status_code == 500
    assert json.loads(response.content) == {"detail": "Internal server error"}


class DatabaseDown(Exception):
    pass


def test_the_500_page_renders_with_the_database_unreachable():
    """No request context: no user, no session, no query. Every connection refuses to
    connect or run anything, and the request's user and session (lazy, as the middleware
    leaves them) raise when looked at; the page renders anyway, and nothing asked."""
    asked = []

    def unreachable(*args, **kwargs):
        asked.append(args)
        raise DatabaseDown("the database is unreachable")

    request = RequestFactory().get("/runs/1/")
    request.user = SimpleLazyObject(unreachable)
    request.session = SimpleLazyObject(unreachable)
    wrapper = type(connections["default"])
    with (
        mock.patch.object(wrapper, "ensure_connection", unreachable),
        mock.patch.object(wrapper, "cursor", unreachable),
    ):
        with pytest.raises(DatabaseDown):  # the patch holds: a query would raise
            connections["default"].cursor()
        asked.clear()
        response = views.server_error(request)
    assert response.status_code == 500
    html = response.content.decode()
    assert VIEWPORT in html and BACK_TO_INBOX in html
    assert asked == []


def test_the_500_page_renders_without_its_stylesheet_when_static_files_are_broken(
    settings, tmp_path
):
    """With DEBUG off the manifest storage raises for a file collectstatic did not collect
    (no manifest at all here: the very fault behind many a 500, since every page links the
    stylesheet): the page renders without it rather than fail."""
    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
    }
    with pytest.raises(ValueError, match="manifest"):  # what {% static %} would raise
        staticfiles_storage.url("approvals/app.css")
    response = _server_error()
    assert response.status_code == 500
    html = response.content.decode()
    assert VIEWPORT in html and BACK_TO_INBOX in html
    assert "app.css" not in html


def test_the_500_page_falls_back_to_djangos_plain_page_when_its_template_fails():
    real = errors.render_to_string

    def broken(name, *args, **kwargs):
        if name == "approvals/500.html":
            raise RuntimeError("broken template")
        return real(name, *args, **kwargs)

    with mock.patch.object(errors, "render_to_string", side_effect=broken):
        response = _server_error()
    assert response.status_code == 500
    assert "Server Error (500)" in response.content.decode()
