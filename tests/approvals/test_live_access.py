"""approvals.live.access: live pages follow their viewer's access. Signing out closes the
live pages of that session only; removing a viewer from their group ends their pages at once."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from .factories import TIMEOUT, halted_run, in_thread, open_socket, socket_for_session, user_of
from .factories import signed_in_client as _signed_in_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("in_memory_layer")]


async def test_signing_out_closes_that_sessions_live_pages_only():
    reviewer = await user_of("reviewer")
    run, _ = await halted_run(reviewer)
    client, session = await database_sync_to_async(_signed_in_client)(reviewer)
    _, other_session = await database_sync_to_async(_signed_in_client)(reviewer)
    inbox = await socket_for_session("/ws/inbox/", session)
    run_page = await socket_for_session(f"/ws/runs/{run.pk}/", session)
    elsewhere = await socket_for_session("/ws/inbox/", other_session)
    try:
        response = await database_sync_to_async(client.post)("/accounts/logout/")
        assert response.status_code == 302
        for comm in (inbox, run_page):
            output = await comm.receive_output(timeout=TIMEOUT)
            assert output == {"type": "websocket.close", "code": 4401}
        # the same user's other session (another browser) stays live
        assert await elsewhere.receive_nothing(timeout=0.3)
        await halted_run(reviewer)
        assert "afterbegin:#request-rows" in await elsewhere.receive_from(timeout=TIMEOUT)
    finally:
        for comm in (inbox, run_page, elsewhere):
            await comm.disconnect()


async def test_removing_a_viewer_from_their_group_ends_their_live_pages_at_once():
    from django.contrib.auth.models import Group

    reviewer = await user_of("reviewer")
    watcher = await user_of("watcher")
    comm, _ = await open_socket("/ws/inbox/", watcher)
    try:

        def leave():
            watcher.groups.remove(Group.objects.get(name="Watchers"))

        await in_thread(leave)
        output = await comm.receive_output(timeout=TIMEOUT)
        assert output == {"type": "websocket.close", "code": 4403}
        await halted_run(reviewer)  # nothing about it reaches the closed page
        assert await comm.receive_nothing(timeout=0.3)
    finally:
        await comm.disconnect()
