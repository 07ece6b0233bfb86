"""The request guards' place in the project's middleware: every request runs its middleware in
one thread, not crossing to the event loop and back for each middleware's own hooks."""

from __future__ import annotations

from unittest import mock

import pytest
from asgiref.sync import SyncToAsync, async_to_sync
from django.test import AsyncClient

from .factories import bearer, make_user, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)


def _thread_crossings(send_request) -> int:
    """How many times the request went from the event loop into a thread (asgiref's
    SyncToAsync): each crossing waits for that loop, which the live pages also keep busy."""
    calls = 0
    original = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        nonlocal calls
        calls += 1
        return await original(self, *args, **kwargs)

    with mock.patch.object(SyncToAsync, "__call__", counted):
        send_request()
    return calls


def test_an_api_decision_crosses_from_the_event_loop_into_a_thread_a_few_times_only():
    reviewer = make_user(role="reviewer")
    request = start_and_halt().requests.get()
    client, headers = AsyncClient(), bearer(reviewer)
    url = f"/api/requests/{request.request_id}/decline"
    response = None

    def decline() -> None:
        nonlocal response
        response = async_to_sync(client.post)(
            url, data={"reason": "not today"}, content_type="application/json", headers=headers
        )

    crossings = _thread_crossings(decline)
    assert response is not None and response.status_code == 200, response.content
    # 5: into the sync middleware chain, the CSRF view check, the view, and closing the
    # response. With the guard above the async-capable middleware, each of those crossed
    # again for its own request and response hooks: 15.
    assert crossings <= 5, crossings


def test_a_page_crosses_from_the_event_loop_into_a_thread_a_few_times_only():
    reviewer = make_user(role="reviewer")
    client = AsyncClient()
    client.force_login(reviewer)
    response = None

    def inbox() -> None:
        nonlocal response
        response = async_to_sync(client.get)("/")

    crossings = _thread_crossings(inbox)
    assert response is not None and response.status_code == 200
    assert crossings <= 5, crossings  # 15 with the guard above the async-capable middleware
