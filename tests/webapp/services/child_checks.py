"""Run only inside the child pytest of test_redis_postgres.py (given by path, so never collected alone).

Proves that the child's settings really switched to PostgreSQL and the Redis channel layer: without
this, a settings mistake would quietly run the consumer slice on SQLite and the in-memory layer.
"""

import pytest


@pytest.mark.django_db(transaction=True)
async def test_the_services_are_in_use():
    from channels.layers import get_channel_layer
    from channels_redis.core import RedisChannelLayer
    from django.db import connection

    assert connection.vendor == "postgresql"
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "probe", "frame": "x" * 7680})
    assert (await layer.receive(channel))["frame"] == "x" * 7680
