"""An idle live-push channel survives the Redis client's read timeout.

channels-redis waits for messages with a 5 s blocking pop; redis-py 8 reads with a 5 s
socket timeout by default, so with an unconfigured client every consumer that saw no message
for 5 s died ("Timeout reading from ...") and its page lost live updates.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from channels_redis.core import RedisChannelLayer
from django.conf import settings

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL"),
]


async def test_a_receive_outlasts_the_blocking_pop_and_the_socket_timeout():
    # The layer exactly as the app configures it (a fresh one: this test owns its loop).
    config = settings.CHANNEL_LAYERS["default"]
    assert config["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    layer = RedisChannelLayer(**config["CONFIG"])
    channel = await layer.new_channel()
    try:
        receiving = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(7)  # longer than both 5 s timeouts
        assert not receiving.done(), receiving.exception() if receiving.done() else None
        await layer.send(channel, {"type": "hello", "text": "still here"})
        message = await asyncio.wait_for(receiving, 10)
        assert message == {"type": "hello", "text": "still here"}
    finally:
        await layer.flush()
        await layer.close_pools()
