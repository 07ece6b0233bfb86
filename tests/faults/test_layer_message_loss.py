"""A group message reaches every page of a server process while another page disconnects.

channels_redis.core.RedisChannelLayer gives all consumers of a process one Redis key (the
process channel) and one receive lock: the consumer holding the lock waits in BZPOPMIN for
everybody. When that consumer's page disconnects, channels cancels its receive; if Redis
has already popped a message for it and the loop has not yet read the reply, redis-py drops
the connection with the reply unread and the message is gone for every page of the process
(django/channels_redis#366, django/channels#1683). Under load (a loop busy for a few ms,
pages coming and going) this happened now and then (bench/decision_latency.py: a decision
never reached the inboxes of one server); here the interleaving is made certain: the other
process's group_send completes while this loop is held, then the lock holder is cancelled
before the loop runs again. The core layer failed this test in every run; the project uses
the pub/sub layer, where a cancelled receive loses only its own page's queue.

Uses the layer the project configures (settings.CHANNEL_LAYERS) with a prefix of its own
(Redis pub/sub ignores database numbers); only its own keys are flushed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time

import pytest
from django.conf import settings
from django.utils.module_loading import import_string

REDIS_URL = os.environ.get("REDIS_URL", "")


pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL"),
]

ROUNDS = 3
WAIT = 8  # seconds: longer than the core layer's 5 s BZPOPMIN


def _make_layer(prefix: str):
    config = settings.CHANNEL_LAYERS["default"]
    if not config["BACKEND"].startswith("channels_redis."):
        pytest.skip(f"the project's layer is {config['BACKEND']}, not a Redis one")
    return import_string(config["BACKEND"])(**{**config["CONFIG"], "prefix": prefix})


async def _close(layer) -> None:
    await layer.flush()  # this layer's prefix only
    if hasattr(layer, "close_pools"):
        await layer.close_pools()


class OtherProcess:
    """Another server process: its own layer instance on its own thread and event loop."""

    def __init__(self, prefix: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.layer = _make_layer(prefix)

    def _serve(self) -> None:
        self.loop.run_forever()
        # Closed on its own thread: channels_redis's close hook runs the loop once more.
        self.loop.close()

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        try:
            self.run(_close(self.layer))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


async def test_a_disconnecting_page_does_not_take_a_group_message_from_the_others():
    prefix = f"tnloss{secrets.token_hex(4)}"
    layer = _make_layer(prefix)
    other = OtherProcess(prefix)
    pending: list[asyncio.Future] = []
    try:
        for n in range(1, ROUNDS + 1):
            steady = await layer.new_channel()  # a page that stays
            leaving = await layer.new_channel()  # a page that is about to close
            await layer.group_add("inbox", steady)
            await layer.group_add("inbox", leaving)
            # The leaving page's receive starts first: on the core layer it takes the
            # process's receive lock and waits in Redis for both.
            leaving_receive = asyncio.ensure_future(layer.receive(leaving))
            await asyncio.sleep(0.3)
            steady_receive = asyncio.ensure_future(layer.receive(steady))
            pending = [leaving_receive, steady_receive]
            await asyncio.sleep(0.1)

            # One step of a busy loop: the other process's update reaches Redis, then the
            # leaving page disconnects and channels cancels its receive.
            other.run(other.layer.group_send("inbox", {"type": "inbox.update", "n": n}))
            time.sleep(0.05)
            leaving_receive.cancel()
            await layer.group_discard("inbox", leaving)

            done, _ = await asyncio.wait([steady_receive], timeout=WAIT)
            assert done, (
                f"round {n}: the page that stayed never got the group message "
                f"(waited {WAIT} s) after another page of its process disconnected"
            )
            assert steady_receive.result() == {"type": "inbox.update", "n": n}
            await asyncio.gather(leaving_receive, return_exceptions=True)
            await layer.group_discard("inbox", steady)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await _close(layer)
        other.close()
