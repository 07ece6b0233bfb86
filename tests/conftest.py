"""Shared fixtures. Engine tests need no Django; app tests get a database per test."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    # Browser tests last: they are the slowest, and Playwright's sync API holds an event loop
    # in the main thread while a browser is open.
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


def pytest_configure(config):
    # Tests never reach a real model: no key from the developer's shell may leak in.
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY"):
        os.environ.pop(key, None)
    _no_connection_pool_in_this_process()


def _no_connection_pool_in_this_process():
    """The app's own processes pool PostgreSQL connections by default; this one does not.
    channels' test communicator patches `close_old_connections` out (so that a TestCase's
    transaction survives a consumer), which keeps every consumer thread's connection checked
    out: a pool of 10 runs dry after a few dozen socket tests. The servers and workers the
    fault and browser suites start run with the default, the pool on."""
    from django.conf import settings

    if settings.configured:
        settings.DATABASES["default"].get("OPTIONS", {}).pop("pool", None)


@pytest.fixture
def on_postgres():
    from django.db import connection

    return connection.vendor == "postgresql"


@pytest.fixture(autouse=True)
def _fresh_cache(request):
    """Throttle counts, open-socket counts and rendered live fragments live in the cache,
    which outlives each test's database: every database test starts with an empty one."""
    if "django_db_setup" in request.fixturenames or request.node.get_closest_marker("django_db"):
        from django.core.cache import cache

        cache.clear()
    yield
