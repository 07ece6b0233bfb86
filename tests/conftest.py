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
    _demo_replies_at_once()
    _finished_task_rows_kept()


def _finished_task_rows_kept():
    """A step's task row goes with its outcome by default (approvals.execution.taskrow); in
    this process's tests it is kept, marked, as the fault suite keeps it, so that a test can
    count the tasks a run had (tasks_for). The tests of the removal set it to 0; the servers
    the browser suites start keep the default."""
    from django.conf import settings

    if settings.configured:
        settings.TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS = 86400


def _demo_replies_at_once():
    """The demo's model streams its replies word by word (TOOLNEXUS_DEMO_WORD_SECONDS): in
    this process's tests it answers at once, or every demo run would wait for its words.
    Tests of streaming set it; the servers the browser suites start keep the default."""
    from django.conf import settings

    if settings.configured:
        settings.TOOLNEXUS_DEMO_WORD_SECONDS = 0


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
