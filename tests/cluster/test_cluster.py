"""The production topology on loopback (make cluster's): PostgreSQL, Redis, two echo inference services
on TCP with the registry, two daphne processes behind nginx, Celery worker and beat.

Real processes, real sockets: callers are WebSocket clients with API keys, through nginx or
straight to one daphne process. The order inside the module matters little: each test opens its
own users' sessions and the service-failure test restores what it breaks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import time

import numpy as np
import pytest
from websockets.asyncio.client import connect

from inference.transport import wire
from tests.cluster.rogue_service import RogueService
from tests.cluster.topology import Cluster

HEARTBEAT_TIMEOUT_S = 2.5
FRAME = base64.b64encode(np.full(1920, 500, dtype="<i2").tobytes()).decode()
KEYS_SCRIPT = """
import json
from django.contrib.auth import get_user_model
from webapp.accounts.services import apikey_create
keys = {}
for i in range(13):
    user, _ = get_user_model().objects.get_or_create(username=f"cluster{i}")
    keys[user.username] = apikey_create(user=user, name="cluster test")[1]
print("KEYS=" + json.dumps(keys))
"""


@pytest.fixture(scope="module")
def cluster():
    with Cluster(services=2, daphnes=2, slots=4, heartbeat_s=0.5, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S) as running:
        out = running.manage("shell", "-c", KEYS_SCRIPT)
        running.keys = json.loads(next(line for line in out.splitlines() if line.startswith("KEYS="))[5:])
        yield running


class Caller:
    """One WebSocket client of /v1/realtime; a background task reads every event as it comes
    (a client that stops reading would stall its socket and miss the server's keepalive pings)."""

    def __init__(self, ws):
        self.ws = ws
        self.session_id: str | None = None
        self.events: list[dict] = []
        self.closed: Exception | None = None
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, base_ws_url: str, key: str) -> Caller:
        ws = await connect(f"{base_ws_url}/v1/realtime", additional_headers={"Authorization": f"Bearer {key}"})
        caller = cls(ws)
        created = await caller.until("session.created")
        caller.session_id = created["session"]["id"]
        return caller

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                if not isinstance(message, bytes):
                    self.events.append(json.loads(message))
                    self._arrived.set()
        except Exception as exc:  # noqa: BLE001 - kept for the assertion that waits on this socket
            self.closed = exc
        self.closed = self.closed or ConnectionError("closed")
        self._arrived.set()

    def errors(self, code: str) -> list[str]:
        """The messages of the error events with ``code``, in order."""
        return [e["error"]["message"] for e in self.events if e["type"] == "error" and e["error"]["code"] == code]

    def any(self, kind: str) -> bool:
        return any(e["type"] == kind for e in self.events)

    async def until(self, kind: str, wait_s: float = 15.0) -> dict:
        """The first event of ``kind`` (already received or still to come)."""
        deadline = time.monotonic() + wait_s
        while True:
            found = next((e for e in self.events if e["type"] == kind), None)
            if found is not None:
                return found
            if self.closed is not None:
                raise AssertionError(f"socket closed ({self.closed}) before {kind}: {[e['type'] for e in self.events]}")
            self._arrived.clear()
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {kind} within {wait_s} s: {[e['type'] for e in self.events][-10:]}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    async def talk(self, frames: int = 5) -> None:
        for _ in range(frames):
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": FRAME}))
            await asyncio.sleep(0.08)

    async def audio_after(self, count: int, wait_s: float = 10.0) -> None:
        """Wait for a new output audio delta beyond the first ``count`` events."""
        deadline = time.monotonic() + wait_s
        while not any(e["type"] == "response.output_audio.delta" for e in self.events[count:]):
            assert time.monotonic() < deadline, "no new audio"
            await asyncio.sleep(0.05)


async def hang_up(caller: Caller) -> None:
    """End the session (not just the socket, which would leave it detached holding its slot)."""
    if not caller.any("session.closed") and caller.closed is None:
        await caller.ws.send(json.dumps({"type": "session.close"}))
        await caller.until("session.closed")
    await caller.ws.close()


def holders(cluster: Cluster) -> dict[str, str]:
    """session_id -> service_id, as the registry's heartbeats say."""
    return {s["session_id"]: sid for sid, record in cluster.registry().items() for s in record["sessions"]}


def holders_on(cluster: Cluster, service_id: str) -> set[str]:
    """The sessions ``service_id``'s last heartbeat says it holds."""
    return {session for session, sid in holders(cluster).items() if sid == service_id}


async def wait_until(predicate, wait_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} not met within {wait_s} s")


async def test_sessions_spread_over_both_services_through_nginx(cluster):
    callers = [await Caller.open(cluster.nginx.ws_url, cluster.keys[f"cluster{i}"]) for i in range(4)]
    try:
        ids = {c.session_id for c in callers}
        placed = await wait_until(
            lambda: ids <= set(holders(cluster)) and holders(cluster), what="all sessions in heartbeats"
        )
        per_service = {sid: sum(placed[i] == sid for i in ids) for sid in ("svc-a", "svc-b")}
        assert per_service == {"svc-a": 2, "svc-b": 2}, per_service  # least loaded first: 2 and 2, not 4 and 0
    finally:  # a failure here must not leave four slots taken for the tests after it
        for caller in callers:
            await hang_up(caller)


async def test_a_reconnect_through_the_other_daphne_resumes_the_same_session(cluster):
    first_daphne, second_daphne = (url.replace("http://", "ws://") for url in cluster.daphne_urls)
    key = cluster.keys["cluster4"]
    caller = await Caller.open(first_daphne, key)
    await caller.talk()
    await caller.ws.close()  # the socket drops: the session waits out the grace period, paused
    await wait_until(
        lambda: any(
            s["session_id"] == caller.session_id and s["state"] == "detached"
            for r in cluster.registry().values()
            for s in r["sessions"]
        ),
        what="the session shown detached",
    )
    again = await Caller.open(second_daphne, key)
    created = next(e for e in again.events if e["type"] == "session.created")
    assert again.session_id == caller.session_id and created.get("resumed") is True
    seen = len(again.events)
    await again.talk()
    await again.audio_after(seen)  # the resumed session streams again
    await hang_up(again)


async def test_a_hung_service_is_detected_by_its_heartbeats_its_callers_fail_and_new_calls_go_to_the_survivor(
    cluster,
):
    callers = [await Caller.open(cluster.nginx.ws_url, cluster.keys[f"cluster{i}"]) for i in range(5, 9)]
    ids = {c.session_id for c in callers}
    placed = await wait_until(lambda: ids <= set(holders(cluster)) and holders(cluster), what="sessions in heartbeats")
    victim = cluster._slot("svc-a").process.popen
    on_victim = [c for c in callers if placed[c.session_id] == "svc-a"]
    survivors = [c for c in callers if placed[c.session_id] == "svc-b"]
    assert on_victim and survivors

    # SIGSTOP: the process hangs with its TCP connections open, so only the missing heartbeats tell.
    stopped_at = time.monotonic()
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        for caller in on_victim:
            assert (await caller.until("session.closed", wait_s=HEARTBEAT_TIMEOUT_S + 5))["reason"] == "engine_failed"
            (reason,) = caller.errors("engine_failed")[:1]
            assert "svc-a is down" in reason and "no heartbeat" in reason, reason
        detected_s = time.monotonic() - stopped_at
        assert detected_s < HEARTBEAT_TIMEOUT_S + 2.0, detected_s  # the timeout plus one watch period and slack
        cluster.wait_for_service("svc-a", "down", within_s=1)
        # The survivor's callers are untouched and new calls go there.
        for caller in survivors:
            seen = len(caller.events)
            await caller.talk(2)
            await caller.audio_after(seen)
        # As many as the survivor has slots left: the four callers may have split 1-3 (placement reads heartbeats
        # up to 0.5 s old), and a fifth call on svc-b's 4 slots would wait in its queue.
        room = min(2, 4 - len(holders_on(cluster, "svc-b")))
        assert room >= 1, holders(cluster)
        newcomers = [await Caller.open(cluster.nginx.ws_url, cluster.keys[f"cluster{i}"]) for i in (9, 10)[:room]]
        fresh = {c.session_id for c in newcomers}
        placed = await wait_until(lambda: fresh <= set(holders(cluster)) and holders(cluster), what="new sessions")
        assert {placed[i] for i in fresh} == {"svc-b"}
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        os.kill(victim.pid, signal.SIGCONT)
        victim.wait(10)
        # Restarting it (same id, same port) brings it back into the registry, serving; also when the test
        # failed above, so the module's other tests still find two services.
        cluster.start_service("svc-a")
        record = cluster.wait_for_service("svc-a", "serving", within_s=30)
    assert record["slots_used"] == 0
    for caller in [*survivors, *newcomers]:
        await hang_up(caller)


async def test_a_killed_services_callers_get_engine_failed_at_once(cluster):
    callers: list[Caller] = []
    caller = None
    for i in (0, 11, 2, 3):  # least loaded first, from heartbeats up to 0.5 s old: one soon lands on svc-b
        callers.append(await Caller.open(cluster.nginx.ws_url, cluster.keys[f"cluster{i}"]))
        sid = callers[-1].session_id
        if await wait_until(lambda sid=sid: holders(cluster).get(sid), what="placement") == "svc-b":
            caller = callers[-1]
            break
    assert caller is not None, "no call was placed on svc-b"
    cluster.kill_service("svc-b")  # SIGKILL: the TCP connections drop at once
    # A new call at once, before the registry could mark svc-b down: placed on svc-a, not refused.
    newcomer = await Caller.open(cluster.nginx.ws_url, cluster.keys["cluster1"])
    assert (await wait_until(lambda: holders(cluster).get(newcomer.session_id), what="placement")) == "svc-a"
    callers.append(newcomer)
    assert (await caller.until("session.closed", wait_s=5))["reason"] == "engine_failed"
    reason = caller.errors("engine_failed")[0]
    assert reason == "lost the connection to the inference service svc-b", reason
    cluster.start_service("svc-b")
    cluster.wait_for_service("svc-b", "serving", within_s=30)
    for other in callers:
        await hang_up(other)


def test_a_tcp_connection_without_the_shared_token_is_refused_and_logged(cluster):
    slot = cluster._slot("svc-a")
    with socket.create_connection(("127.0.0.1", slot.port), timeout=5) as raw:
        raw.sendall(wire.json_frame({"op": "capabilities"}))  # no hello with the token first
        answer = b""
        while chunk := raw.recv(4096):  # until the service closes the connection
            answer += chunk
    body = json.loads(answer[5:])
    assert body["error"]["code"] == "unauthenticated" and "ok" not in body  # and nothing was served
    log = (cluster.var_dir / "logs" / "svc-a.log").read_text()
    assert "refused" in log.lower()


def test_the_clusters_redis_refuses_a_client_without_its_password(cluster):
    import redis

    url = redis.connection.parse_url(cluster.redis_url)
    assert url["password"], "make cluster's Redis URL carries its password"
    anonymous = redis.Redis(host=url["host"], port=url["port"])
    with pytest.raises(redis.AuthenticationError):  # what a local process as nobody tried in issue 30
        anonymous.hset("parley:services", "rogue", "{}")
    anonymous.close()
    assert "rogue" not in cluster.registry()


async def test_a_forged_registry_record_gets_nothing_and_the_call_goes_to_a_real_service(cluster):
    """Issue 30's attack, by someone who can write to the registry's Redis (its password leaked, or a deployment
    without one): a record with 1000 free slots that points at their listener. It is ignored and logged, never
    dialled; the caller is served by svc-a or svc-b."""
    import redis

    real = cluster.registry()["svc-a"]
    client = redis.Redis.from_url(cluster.redis_url)
    stop = asyncio.Event()
    with RogueService() as rogue:
        unsigned = {**real, "sessions": [], "slots_used": 0, "slots_total": 1000, "queue_length": 0}
        unsigned.update(service_id="aaa-rogue", address=rogue.address)  # first in id order: the old code's pick
        unsigned.pop("signature", None)
        copied = {**unsigned, "service_id": "aab-rogue", "signature": real.get("signature", "")}  # a real one, reused

        async def keep_fresh() -> None:  # heartbeats, as a live service would write them
            while not stop.is_set():
                for record in (unsigned, copied):
                    record["heartbeat_at"] = time.time()
                    client.hset("parley:services", record["service_id"], json.dumps(record))
                await asyncio.sleep(0.3)

        forging = asyncio.create_task(keep_fresh())
        caller = None
        try:
            await asyncio.sleep(0.5)
            with contextlib.suppress(AssertionError, OSError):  # on the old code the call hangs on the rogue
                caller = await Caller.open(cluster.nginx.ws_url, cluster.keys["cluster12"])
            got = bytes(rogue.received)
            token = cluster.env["PARLEY_INFERENCE_TOKEN"].encode()
            assert token not in got and b'"open"' not in got and b"user" not in got, got[:300]
            assert rogue.connections == 0 and got == b"", "a forged record must never be dialled"
            assert caller is not None, "the call was not served"
            service = await wait_until(lambda: holders(cluster).get(caller.session_id), what="placement")
            assert service in ("svc-a", "svc-b"), service
            seen = len(caller.events)
            await caller.talk(2)
            await caller.audio_after(seen)  # served by the real echo service
        finally:
            stop.set()
            await forging
            client.hdel("parley:services", "aaa-rogue", "aab-rogue")
            client.close()
            if caller is not None:
                await hang_up(caller)
    logs = "".join((cluster.var_dir / "logs" / f"daphne-{i}.log").read_text(errors="replace") for i in (1, 2))
    forged = [line for line in logs.splitlines() if "registry.forged_record" in line]
    assert any("aaa-rogue" in line and "unsigned" in line for line in forged), forged[:5]
    assert any("aab-rogue" in line and "signature" in line for line in forged), forged[:5]
    assert cluster.env["PARLEY_INFERENCE_TOKEN"] not in logs


def test_each_service_exposes_its_own_prometheus_metrics(cluster):
    text = cluster.metrics("svc-a")
    assert 'parley_slots_total{service="svc-a"} 4.0' in text
    assert 'parley_service_state{service="svc-a",state="serving"} 1.0' in text
    assert "svc-b" not in text  # per process: a service reports itself
