"""The Redis registry on a real throwaway redis-server: heartbeats, down detection, placement, drain, admission,
and the signed records that make a forged service invisible."""

from __future__ import annotations

import json
import logging
import time

import pytest
import redis

from inference.cluster import signed_records
from inference.cluster.registry import SERVICES_KEY, Heartbeat, Registry, capabilities_now
from inference.config import InferenceConfig
from inference.contracts import ParleyError
from inference.service import InferenceService
from inference.status import ServiceStatus, SessionStatus, status_from_dict, status_to_dict

SECRET = "registry-secret-for-this-test"


@pytest.fixture
def registry_url(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    yield redis_server.url
    client.flushdb()
    client.close()


def publish(url: str, service_id: str, *, used: int, total: int = 4, queue: int = 0, age_s: float = 0.0, users=(),
            secret: str | None = SECRET, field: str | None = None, **changes):  # fmt: skip
    """Write a record as a service's heartbeat would (``age_s`` back in time), signed with ``secret`` (None: unsigned),
    under ``field`` (default: its service id); ``changes`` alter the record after it was signed."""
    sessions = tuple(
        SessionStatus(
            session_id=f"sess_{u}", user_key=u, service_id=service_id, engine="echo", state="active", duration_s=1.0
        )  # fmt: skip
        for u in users
    )
    status = ServiceStatus(
        service_id=service_id, address=f"tcp://127.0.0.1:1{len(service_id)}", host="h", device="cpu", engine="echo",
        checkpoint=None, slots_used=used, slots_total=total, queue_length=queue, tick_ms_p50=1.0, tick_ms_p99=2.0,
        gpu_memory={}, state="serving", heartbeat_at=time.time() - age_s, sessions=sessions,
    )  # fmt: skip
    record = status_to_dict(status)
    if secret is not None:
        record = signed_records.sign(record, secret)
    client = redis.Redis.from_url(url)
    client.hset(SERVICES_KEY, field or service_id, json.dumps({**record, **changes}))
    client.close()


async def test_silent_services_read_as_down_with_the_reason(registry_url):
    publish(registry_url, "svc-a", used=0)
    publish(registry_url, "svc-b", used=2, age_s=10, users=("gone1", "gone2"))
    services = {s.service_id: s for s in await Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET).services()}
    assert services["svc-a"].state == "serving" and services["svc-a"].down_reason is None
    assert services["svc-b"].state == "down" and "no heartbeat for 10" in services["svc-b"].down_reason
    assert services["svc-b"].sessions == () and services["svc-b"].slots_used == 0


async def test_placement_spreads_then_sticks_to_the_users_service(registry_url):
    publish(registry_url, "svc-a", used=1)
    publish(registry_url, "svc-b", used=1)
    registry = Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET)
    placed = [(await registry.route(f"user{i}")).service_id for i in range(4)]
    # Placements not yet visible in a heartbeat count: two new sessions each, not four on one service.
    assert sorted(placed) == ["svc-a", "svc-a", "svc-b", "svc-b"]
    # Another web process (a fresh Registry) finds user0's service again from the placement key.
    assert (await Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET).route("user0")).service_id == placed[0]


async def test_routers_behind_one_nginx_see_each_others_placements_before_a_heartbeat(registry_url):
    """Two daphnes (two routers) place alternately on idle services: each counts the other's placements, which
    no heartbeat shows yet, so the calls spread 2 and 2; a user placed by one router stays there via the other."""
    publish(registry_url, "svc-a", used=0)
    publish(registry_url, "svc-b", used=0)
    routers = [
        Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET),
        Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET),
    ]
    placed = [(await routers[i % 2].route(f"user{i}")).service_id for i in range(4)]
    # the second call goes to svc-b although its router placed nothing yet (alone it would pick svc-a again)
    assert placed == ["svc-a", "svc-b", "svc-a", "svc-b"], placed
    assert (await routers[1].route("user0")).service_id == "svc-a"  # sticky across routers


async def test_a_placement_counts_until_a_heartbeat_lists_its_session(registry_url):
    """A heartbeat written after a placement but before the caller reached the service shows the session nowhere:
    the placement still counts, so the next caller goes to the other service."""
    publish(registry_url, "svc-a", used=0)
    publish(registry_url, "svc-b", used=0)
    registry = Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET)
    assert (await registry.route("user0")).service_id == "svc-a"
    publish(registry_url, "svc-a", used=0)  # newer than the placement, user0 not there yet
    assert (await registry.route("user1")).service_id == "svc-b"
    publish(registry_url, "svc-a", used=1, users=("user0",))  # user0 arrived: counted once, by the heartbeat
    publish(registry_url, "svc-b", used=1, users=("user1",))
    assert (await registry.route("user2")).service_id == "svc-a"


async def test_full_services_queue_on_the_shortest_queue_and_down_ones_are_skipped(registry_url):
    publish(registry_url, "svc-a", used=4, queue=3)
    publish(registry_url, "svc-b", used=4, queue=1)
    publish(registry_url, "svc-c", used=0, age_s=30)  # free slots but silent
    assert (await Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET).route("u")).service_id == "svc-b"


async def test_a_users_service_going_down_moves_them_to_a_survivor(registry_url):
    publish(registry_url, "svc-a", used=1, users=("u",))
    publish(registry_url, "svc-b", used=3)
    registry = Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET)
    assert (await registry.route("u")).service_id == "svc-a"
    publish(registry_url, "svc-a", used=1, users=("u",), age_s=5)
    assert (await Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET).route("u")).service_id == "svc-b"


async def test_drain_keeps_existing_users_and_admission_stop_refuses_new_ones(registry_url):
    publish(registry_url, "svc-a", used=0, users=("old",))
    publish(registry_url, "svc-b", used=2)
    registry = Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET)
    assert (await registry.route("old")).service_id == "svc-a"
    await registry.set_draining("svc-a", True)
    draining = redis.Redis.from_url(registry_url)
    record = json.loads(draining.hget(SERVICES_KEY, "svc-a"))
    record["state"] = "draining"  # what svc-a's next heartbeat says once it read the drain key
    draining.hset(SERVICES_KEY, "svc-a", json.dumps(signed_records.sign(record, SECRET)))
    draining.close()
    assert (await registry.route("old")).service_id == "svc-a"  # its session is there: reattach
    assert (await registry.route("new")).service_id == "svc-b"  # nothing new on a draining service

    await registry.set_admission(False)
    with pytest.raises(ParleyError) as refused:
        await registry.route("newer")
    assert refused.value.code == "resource_exhausted" and refused.value.param == "admission"
    assert (await registry.route("old")).service_id == "svc-a"  # live users still reach their session
    await registry.set_admission(True)
    assert (await registry.route("newer")).service_id == "svc-b"


async def test_no_serving_service_is_a_clear_error(registry_url):
    publish(registry_url, "svc-a", used=0, age_s=60)
    with pytest.raises(ParleyError, match=r"no inference service is accepting calls: svc-a \(down\)"):
        await Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET).route("u")


async def test_a_real_services_heartbeat_round_trips_and_follows_the_drain_key(registry_url):
    service = InferenceService(InferenceConfig(engine="echo", slots=3))
    await service.start()
    try:
        beat = Heartbeat(
            service, redis_url=registry_url, secret=SECRET, service_id="svc-x", address="tcp://127.0.0.1:7",
            interval_s=0.5,
        )  # fmt: skip
        published = await beat.beat()
        (read,) = await Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET).services()
        assert read == status_from_dict(status_to_dict(published))
        assert (read.state, read.slots_total, read.engine, read.address) == ("serving", 3, "echo", "tcp://127.0.0.1:7")
        await Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET).set_draining("svc-x", True)
        assert (await beat.beat()).state == "draining"
        await beat.withdraw()
        assert await Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET).services() == []
    finally:
        await service.stop()


async def test_forged_records_are_ignored_and_logged_once_and_never_chosen(registry_url, caplog):
    """What someone who can write to Redis but does not hold the secret can try: a record of their own (unsigned,
    or signed with another secret), a real record altered (more free slots, their address), or a real record
    filed under another name. None is listed or chosen, however free; each is logged once, not on every read."""
    publish(registry_url, "svc-a", used=3)
    publish(registry_url, "aaa-unsigned", used=0, total=1000, secret=None)
    publish(registry_url, "aab-other-secret", used=0, total=1000, secret="not-" + SECRET)
    publish(registry_url, "aac-altered", used=3, slots_total=1000, address="tcp://127.0.0.1:9")
    publish(registry_url, "svc-a", used=3, field="aad-renamed")
    registry = Registry(registry_url, heartbeat_timeout_s=2, secret=SECRET)
    with caplog.at_level(logging.WARNING, logger="inference.cluster.signed_records"):
        for _ in range(3):
            assert [s.service_id for s in await registry.services()] == ["svc-a"]
        assert (await registry.route("u")).service_id == "svc-a"
    forged = [r for r in caplog.records if r.getMessage().startswith("registry.forged_record")]
    reasons = {r.service_id: r.detail for r in forged}
    assert len(forged) == 4 and set(reasons) == {"aaa-unsigned", "aab-other-secret", "aac-altered", "aad-renamed"}
    assert reasons["aaa-unsigned"] == "unsigned"
    assert "signature does not match" in reasons["aab-other-secret"] and "signature" in reasons["aac-altered"]
    assert "names service 'svc-a'" in reasons["aad-renamed"]
    assert SECRET not in caplog.text
    # The blocking read for pages trusts only the genuine record too.
    client = redis.Redis.from_url(registry_url)
    genuine = {**json.loads(client.hget(SERVICES_KEY, "svc-a")), "capabilities": {"engine": "echo"}}
    client.hset(SERVICES_KEY, "svc-a", json.dumps(signed_records.sign(genuine, SECRET)))
    client.close()
    assert capabilities_now(registry_url, 2, SECRET) == {"engine": "echo"}
    publish(registry_url, "aaa-unsigned", used=0, secret=None, capabilities={"engine": "forged"})
    assert capabilities_now(registry_url, 2, SECRET) == {"engine": "echo"}
    publish(registry_url, "svc-a", used=3, capabilities={"engine": "forged"})  # altered after signing
    assert capabilities_now(registry_url, 2, SECRET) is None


async def test_a_registry_without_the_secret_is_a_clear_error(registry_url):
    publish(registry_url, "svc-a", used=0)
    with pytest.raises(ParleyError, match="PARLEY_INFERENCE_TOKEN is not set"):
        await Registry(registry_url, heartbeat_timeout_s=2, secret=None).services()
    with pytest.raises(ParleyError, match="PARLEY_INFERENCE_TOKEN is not set"):
        Heartbeat(None, redis_url=registry_url, secret="", service_id="s", address="tcp://h:1", interval_s=1)
