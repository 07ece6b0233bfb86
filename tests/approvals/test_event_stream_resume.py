"""`/api/events` read as it streams (the async test client hands the stream over frame by
frame), dropped part-way while events keep coming, and resumed with Last-Event-ID: the host
hears every event exactly once, in order."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from approvals import testing
from approvals.domain import hostevents
from approvals.models import Event

from .factories import bearer, make_user, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 10  # seconds: the longest one frame may take to come


@pytest.fixture(autouse=True)
def live_stream(settings):
    settings.TOOLNEXUS_EVENTS_SETTLE_SECONDS = 0
    settings.TOOLNEXUS_EVENTS_POLL_SECONDS = 0.02
    settings.TOOLNEXUS_EVENTS_STREAM_SECONDS = 60  # the test drops it, not the server


class Stream:
    """An open `/api/events` response, read one event at a time."""

    def __init__(self, response) -> None:
        assert response.status_code == 200
        assert response["Content-Type"] == "text/event-stream"
        self.chunks = response.streaming_content
        self.buffer = ""

    async def next_event(self) -> dict:
        while True:
            while "\n\n" not in self.buffer:
                chunk = await asyncio.wait_for(anext(self.chunks), WAIT)
                self.buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
            block, self.buffer = self.buffer.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if "data" in fields:  # not the `retry` advice or a keep-alive
                return {**fields, "data": json.loads(fields["data"])}

    async def drop(self) -> None:
        """Hang up, as a host whose connection breaks does."""
        await self.chunks.aclose()


def host_event_ids() -> list[str]:
    rows = Event.objects.filter(action__in=hostevents.actions_of(None)).order_by("pk")
    return [f"evt_{pk}" for pk in rows.values_list("pk", flat=True)]


async def test_a_stream_dropped_mid_way_and_resumed_with_last_event_id_misses_nothing():
    reviewer = await sync_to_async(make_user)()
    headers = await sync_to_async(bearer)(reviewer)
    halt = sync_to_async(start_and_halt)
    client = AsyncClient()
    first_run = await halt(user=reviewer)  # run.pending, request.created

    stream = Stream(await client.get("/api/events?after=evt_0", headers=headers))
    seen = [await stream.next_event(), await stream.next_event()]
    second_run = await halt(user=reviewer)  # while the stream is open
    seen.append(await stream.next_event())  # one of its two events; the other is not read
    await stream.drop()

    # while the host is away: both runs decided and finished
    await sync_to_async(testing.decline)(first_run, reason="no")
    await sync_to_async(testing.approve)(second_run)
    expected = await sync_to_async(host_event_ids)()
    assert len(expected) == 8

    resumed = Stream(
        await client.get("/api/events", headers={**headers, "Last-Event-ID": seen[-1]["id"]})
    )
    rest = [await resumed.next_event() for _ in range(len(expected) - len(seen))]
    # the next event is a new one, not a repeat
    await sync_to_async(testing.approve)(await halt(user=reviewer))
    later = await resumed.next_event()
    await resumed.drop()

    heard = [frame["id"] for frame in seen + rest]
    assert heard == expected  # every event once, in order
    assert later["id"] not in heard and int(later["id"][4:]) > int(heard[-1][4:])
    assert [frame["data"]["id"] for frame in seen + rest] == heard
    assert [frame["event"] for frame in rest][-2:] == ["request.decided", "run.finished"]
