"""A bulk decision over the inbox sockets: one toast for the whole decision ("reviewer
declined 2 requests"), none per request, and only what each viewer's agents let them see."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from approvals import services

from .factories import TIMEOUT, in_thread, open_socket, pending_request, start_and_halt, user_of
from .test_live_consumers import _restrict_demo_to_a_new_group

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("in_memory_layer")]


async def _frames(comm) -> str:
    """Every frame that arrives until none comes for a while, joined."""
    frames = []
    while not await comm.receive_nothing(timeout=0.5):
        frames.append(await comm.receive_from(timeout=TIMEOUT))
    return "\n".join(frames)


async def test_a_bulk_decision_is_one_toast_counting_what_each_viewer_may_see(second_demo_agent):
    owner = await user_of("reviewer")
    outsider = await user_of("reviewer")
    await database_sync_to_async(_restrict_demo_to_a_new_group)(owner)
    runs = [
        await in_thread(start_and_halt, user=owner, agent=agent, prompt=f"Refund A-{n}, $1")
        for n, agent in enumerate(["demo", "demo2", "demo2"])
    ]
    hidden, *visible = [await database_sync_to_async(pending_request)(run) for run in runs]
    theirs, _ = await open_socket("/ws/inbox/", owner)
    mine, _ = await open_socket("/ws/inbox/", outsider)
    try:
        await in_thread(
            services.requests_bulk,
            request_ids=[r.request_id for r in (hidden, *visible)],
            user=owner,
            action="decline",
            reason="batch",
        )
        owners = await _frames(theirs)
        assert owners.count('class="toast') == 1
        about = " ".join(f"request-{r.pk}" for r in (hidden, *visible))
        assert f'data-bulk="{about}">You declined 3 requests</p>' in owners

        outsiders = await _frames(mine)
        assert outsiders.count('class="toast') == 1
        about = " ".join(f"request-{r.pk}" for r in visible)
        said = f'<p class="toast" data-bulk="{about}">{owner.username} declined 2 requests</p>'
        assert said in outsiders
        assert "Already declined" not in outsiders
        assert f"request-{hidden.pk}" not in outsiders and f"row-{hidden.pk}" not in outsiders
    finally:
        await theirs.disconnect()
        await mine.disconnect()
