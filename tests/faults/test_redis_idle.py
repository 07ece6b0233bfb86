"""An idle live-push channel survives the Redis client's read timeout.

With the list-based layer (channels_redis.core, used before the pub/sub one) channels-redis
waited for messages with a 5 s blocking pop while redis-py 8 reads with a 5 s socket timeout
by default, so with an unconfigured client every consumer that saw no message for 5 s died
("Timeout reading from ...") and its page lost live updates. The layer the project
configures must keep an idle page live past both.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from django.conf import settings
from django.utils.module_loading import import_string

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL"),
]


async def test_a_receive_outlasts_the_blocking_pop_and_the_socket_timeout():
    # The layer exactly as the app configures it (a fresh one: this test owns its loop).
    config = settings.CHANNEL_LAYERS["default"]
    assert config["BACKEND"].startswith("channels_redis.")
    layer = import_string(config["BACKEND"])(**config["CONFIG"])
    channel = await layer.new_channel()
    try:
        receiving = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(7)  # longer than both 5 s timeouts
        assert not receiving.done(), receiving.exception() if receiving.done() else None
        await layer.send(channel, {"type": "hello", "text": "still here"})
        message = await asyncio.wait_for(receiving, 10)
        assert message == {"type": "hello", "text": "still here"}
    finally:
        await layer.flush()  # the pub/sub layer's flush also closes its connections
        if hasattr(layer, "close_pools"):
            await layer.close_pools()
