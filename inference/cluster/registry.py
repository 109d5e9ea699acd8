"""The service registry in Redis: every inference service's heartbeat, placement, and who holds whose session.

Services write, the web tier reads. Keys (one Redis database, shared with the channel layer):

- ``parley:services`` (hash): service_id -> JSON ``ServiceStatus``, rewritten by each heartbeat and
  signed with the shared secret (``signed_records``): a record that is unsigned, altered or filed
  under another name is ignored and logged (``registry.forged_record``), never dialled.
- ``parley:placement:<user_key>``: the service_id holding that user's session, set by the web process
  that placed it, so a reconnect through any daphne process finds the session again.
- ``parley:drain:<service_id>``: present while an admin drains that service (no new sessions there).
- ``parley:admission``: ``stopped`` while an admin stops admitting new calls everywhere.

A dead service cannot say that it is dead, so "down" is decided by the reader: a record whose last
heartbeat is older than ``heartbeat_timeout_s`` is down. The signature covers ``heartbeat_at``, so
an old record written again reads as down too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from inference.cluster import signed_records
from inference.contracts import ParleyError
from inference.status import History, ServiceStatus, service_status, status_from_dict, status_to_dict

logger = logging.getLogger(__name__)

SERVICES_KEY = "parley:services"
PLACEMENT_KEY = "parley:placement:{user_key}"
DRAIN_KEY = "parley:drain:{service_id}"
ADMISSION_KEY = "parley:admission"
# A placement outlives the session's longest possible life (max duration plus the disconnect grace);
# a stale one is harmless: the router checks that the service still holds the user's session.
PLACEMENT_TTL_S = 2 * 3600
PENDING_WINDOW_S = 3.0  # placements not yet visible in a heartbeat count against a service
# Recent placements per service (user key -> unix time placed), shared by every router: two daphnes behind one
# nginx both see a placement the other made before the service's next heartbeat shows it.
PENDING_KEY = "parley:pending:{service_id}"


def _redis(url: str):
    """A client bound to the running event loop (redis.asyncio connections cannot cross loops)."""
    import redis.asyncio as aioredis

    loop = asyncio.get_running_loop()
    clients = _clients.setdefault(url, weakref.WeakKeyDictionary())
    client = clients.get(loop)
    if client is None:
        client = aioredis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        clients[loop] = client
    return client


_clients: dict[str, weakref.WeakKeyDictionary] = {}


def _unavailable(exc: Exception) -> ParleyError:
    return ParleyError(
        f"the service registry (Redis) is unreachable: {exc}", code="internal_error", error_type="server_error"
    )


def admission_stopped_error() -> ParleyError:
    """An admin stopped admitting new calls (``param="admission"`` tells it from a full queue)."""
    return ParleyError(
        "new calls are paused by an administrator; try again later",
        code="resource_exhausted",
        error_type="rate_limit_error",
        param="admission",
    )


def _no_secret() -> ParleyError:
    return ParleyError(
        "PARLEY_INFERENCE_TOKEN is not set: registry records are signed with it, so none can be trusted",
        code="internal_error",
        error_type="server_error",
    )


_capability_forgeries = signed_records.ForgeryLog()


def capabilities_now(redis_url: str, heartbeat_timeout_s: float, secret: str | None) -> dict[str, Any] | None:
    """Blocking: the engine capabilities of a serving service (for pages rendered outside an event loop)."""
    import redis

    if not secret:
        raise _no_secret()
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=5)
    try:
        raw = client.hgetall(SERVICES_KEY)
    except redis.RedisError as exc:
        raise _unavailable(exc) from exc
    finally:
        client.close()
    now = time.time()
    records = signed_records.genuine(raw, secret, _capability_forgeries)
    for _, record in sorted(records.items()):
        if record.get("state") == "serving" and now - record["heartbeat_at"] <= heartbeat_timeout_s:
            return record.get("capabilities") or None
    return None


# ---- the service side ---------------------------------------------------------------------------


class Heartbeat:
    """Publishes one service's status every ``interval_s`` and follows its drain flag.

    Args:
        service: the running ``InferenceService`` (read on its own loop).
        redis_url: the registry; None builds statuses for ``on_status`` only (a service on its own).
        secret: ``PARLEY_INFERENCE_TOKEN``, which signs every record (required with a ``redis_url``).
        service_id: stable name of this service (a restart under the same id replaces the old record).
        address: where the web tier reaches it (``tcp://host:port`` or ``unix:///path``).
        interval_s: heartbeat period.
        on_status: also handed every status (the metrics exporter).
    """

    def __init__(
        self,
        service,
        *,
        redis_url: str | None,
        secret: str | None = None,
        service_id: str,
        address: str,
        interval_s: float,
        on_status: Callable[[ServiceStatus], None] | None = None,
    ):
        self.service = service
        if redis_url and not secret:
            raise _no_secret()
        self.redis_url = redis_url
        self.secret = secret
        self.service_id = service_id
        self.address = address
        self.interval_s = interval_s
        self.on_status = on_status
        self.history = History()
        self.draining = False

    async def run(self) -> None:
        """Beat until cancelled; a Redis outage is logged and retried, never fatal to the service."""
        while True:
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the service keeps serving its sessions
                logger.warning("registry.heartbeat_failed", extra={"detail": str(exc)})
            await asyncio.sleep(self.interval_s)

    async def beat(self) -> ServiceStatus:
        client = _redis(self.redis_url) if self.redis_url else None
        if client is not None:
            self.draining = bool(await client.exists(DRAIN_KEY.format(service_id=self.service_id)))
        status = self.status()
        if self.on_status is not None:
            self.on_status(status)
        if client is not None:
            record = signed_records.sign(status_to_dict(status), self.secret or "")
            await client.hset(SERVICES_KEY, self.service_id, json.dumps(record))
        return status

    def status(self) -> ServiceStatus:
        return service_status(
            self.service,
            service_id=self.service_id,
            address=self.address,
            state="draining" if self.draining else "serving",
            history=self.history,
        )

    async def withdraw(self) -> None:
        """A clean stop: remove the record (a killed service's record goes stale and reads as down)."""
        if not self.redis_url:
            return
        with contextlib.suppress(Exception):
            await _redis(self.redis_url).hdel(SERVICES_KEY, self.service_id)


# ---- the web tier's side ------------------------------------------------------------------------


async def _recent_placements(client, service_ids: list[str]) -> dict[str, dict[str, float]]:
    """Per service, the users placed there within ``PENDING_WINDOW_S`` by any router (user key -> time)."""
    since = time.time() - PENDING_WINDOW_S
    pipe = client.pipeline(transaction=False)  # one round trip, whatever the number of services
    for service_id in service_ids:
        key = PENDING_KEY.format(service_id=service_id)
        pipe.zremrangebyscore(key, "-inf", since)
        pipe.zrange(key, 0, -1, withscores=True)
    replies = (await pipe.execute())[1::2]
    return {sid: {user.decode(): t for user, t in placed} for sid, placed in zip(service_ids, replies, strict=True)}


class Registry:
    """Reads services, places sessions and records placements.

    Args:
        redis_url: the registry.
        heartbeat_timeout_s: a service silent for longer is down.
        secret: ``PARLEY_INFERENCE_TOKEN``: only records signed with it are read.
    """

    def __init__(self, redis_url: str, *, heartbeat_timeout_s: float, secret: str | None):
        self.redis_url = redis_url
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.secret = secret
        self._forgeries = signed_records.ForgeryLog()

    async def services(self) -> list[ServiceStatus]:
        """Every registered service with a genuine record, sorted by id, with ``state='down'`` for the silent ones."""
        if not self.secret:
            raise _no_secret()
        try:
            raw = await _redis(self.redis_url).hgetall(SERVICES_KEY)
        except Exception as exc:  # noqa: BLE001 - redis raises several unrelated types
            raise _unavailable(exc) from exc
        now = time.time()
        services = []
        for record in signed_records.genuine(raw, self.secret, self._forgeries).values():
            try:
                status = status_from_dict(record)
            except (ValueError, TypeError) as exc:
                logger.warning("registry.bad_record", extra={"detail": str(exc)})
                continue
            silent = now - status.heartbeat_at
            if silent > self.heartbeat_timeout_s:
                reason = f"no heartbeat for {silent:.1f} s (timeout {self.heartbeat_timeout_s:g} s)"
                # Its last sessions are gone with it (their callers got engine_failed): list none.
                status = replace(status, state="down", down_reason=reason, sessions=(), slots_used=0, queue_length=0)
            services.append(status)
        return sorted(services, key=lambda s: s.service_id)

    async def route(self, user_key: str, *, avoid: frozenset[str] = frozenset()) -> ServiceStatus:
        """The service for ``user_key``: the one holding their session, else the least loaded one.

        ``avoid``: services this caller just failed to reach (dead, not yet marked down).
        """
        services = [s for s in await self.services() if s.service_id not in avoid]
        by_id = {s.service_id: s for s in services}
        client = _redis(self.redis_url)
        pending = await _recent_placements(client, [s.service_id for s in services])
        held = await client.get(PLACEMENT_KEY.format(user_key=user_key))
        current = by_id.get(held.decode()) if held else None
        if current is not None and current.state != "down":
            # Sticky only while the user's session lives there (or was just placed, before a heartbeat
            # could show it): a user whose session ended is placed afresh, like anyone else.
            holds = any(s.user_key == user_key for s in current.sessions)
            if holds or user_key in pending[current.service_id]:
                return current
        if await client.get(ADMISSION_KEY) == b"stopped":
            raise admission_stopped_error()
        chosen = self.least_loaded(services, pending)
        await client.set(PLACEMENT_KEY.format(user_key=user_key), chosen.service_id, ex=PLACEMENT_TTL_S)
        key = PENDING_KEY.format(service_id=chosen.service_id)
        await client.zadd(key, {user_key: time.time()})
        await client.expire(key, int(PENDING_WINDOW_S) + 1)
        return chosen

    def least_loaded(
        self, services: list[ServiceStatus], pending: dict[str, dict[str, float]] | None = None
    ) -> ServiceStatus:
        """A serving service with a free slot (fewest used, counting ``pending`` placements not yet in a
        heartbeat); when none has one, the shortest queue per slot: the service queues the call and tells its
        position."""
        serving = [s for s in services if s.state == "serving"]
        if not serving:
            down = ", ".join(f"{s.service_id} ({s.state})" for s in services) or "none registered"
            raise ParleyError(
                f"no inference service is accepting calls: {down}", code="resource_exhausted", error_type="server_error"
            )
        pending = pending or {}

        def used(s: ServiceStatus) -> int:
            # A placement counts until the service's heartbeat lists its user's session. Not "placed after the last
            # heartbeat": a heartbeat taken between a placement and the caller's arrival at the service shows
            # neither, and the next caller went to the same service (tests/cluster saw 3 and 1 instead of 2 and 2).
            arrived = {session.user_key for session in s.sessions}
            return s.slots_used + sum(user not in arrived for user in pending.get(s.service_id, {}))

        with_room = [s for s in serving if used(s) < s.slots_total]
        if with_room:
            return min(with_room, key=lambda s: (used(s) / s.slots_total, s.service_id))
        return min(serving, key=lambda s: ((s.queue_length + 1) / s.slots_total, s.service_id))

    async def set_draining(self, service_id: str, draining: bool) -> None:
        client = _redis(self.redis_url)
        key = DRAIN_KEY.format(service_id=service_id)
        if draining:
            await client.set(key, "1")
        else:
            await client.delete(key)

    async def set_admission(self, open_: bool) -> None:
        client = _redis(self.redis_url)
        if open_:
            await client.delete(ADMISSION_KEY)
        else:
            await client.set(ADMISSION_KEY, "stopped")

    async def admission_open(self) -> bool:
        return await _redis(self.redis_url).get(ADMISSION_KEY) != b"stopped"
