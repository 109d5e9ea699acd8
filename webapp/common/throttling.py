"""Connect limits with the ``limits`` library: WebSocket connects per signed-in user and per API key
(``PARLEY_CONNECTS_PER_USER_PER_MINUTE``, ``PARLEY_CONNECTS_PER_KEY_PER_MINUTE``), and failed
authentications per client IP (``PARLEY_KEY_FAILURE_RATE``: wrong API keys wherever a key is
accepted, the realtime handshake and ``/ops/metrics``, and WebSocket connects without credentials).
An address is never limited for connects that authenticate: many users share one behind a NAT or a
proxy without forwarded headers.

Counts live in ``settings.PARLEY_RATE_LIMIT_STORAGE``: Redis when the deployment has one (every web
process shares the counts), else this process's memory. A refused client is told so by the consumer: an ``error``
event with code ``rate_limit_exceeded`` and close code 4429 (as HTTP 429); an HTTP client gets 429.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from dataclasses import dataclass

from django.conf import settings
from limits import RateLimitItem, parse
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string


@dataclass(frozen=True)
class Refusal:
    """Why a client is refused and when it may try again."""

    message: str
    retry_after_s: int


def client_ip(scope: dict) -> str:
    """The client address (``webapp.common.forwarded`` resolved it from trusted proxies only)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


# A Redis storage holds an asyncio connection pool, which belongs to the event loop it was made on:
# one limiter per (loop, URI) for those (daphne runs one loop for its life; a test run makes many).
# The in-memory storage stays one per process, so that its counts are shared across loops (a sync caller's
# async_to_sync runs each call on a loop of its own). Its counts are plain dicts, but its per-key locks and
# expiry timer bind to the loop that used them: a lock left held on a finished loop would fail every later
# count with "bound to a different event loop". So when the loop changes, those are made anew here (the
# library's own unpickling path: ``__getstate__`` drops them, ``__setstate__`` recreates them) and the counts kept.
_redis_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, MovingWindowRateLimiter]] = (
    weakref.WeakKeyDictionary()
)
_memory_limiters: dict[str, tuple[MovingWindowRateLimiter, weakref.ref[asyncio.AbstractEventLoop]]] = {}


def _current() -> MovingWindowRateLimiter:
    uri = settings.PARLEY_RATE_LIMIT_STORAGE
    loop = asyncio.get_running_loop()
    if uri.startswith("async+redis"):
        limiters = _redis_limiters.setdefault(loop, {})
        if uri not in limiters:
            limiters[uri] = MovingWindowRateLimiter(storage_from_string(uri, implementation="redispy"))
        return limiters[uri]
    if uri not in _memory_limiters:
        _memory_limiters[uri] = (MovingWindowRateLimiter(storage_from_string(uri)), weakref.ref(loop))
    limiter, used_on = _memory_limiters[uri]
    if used_on() is not loop:
        storage = limiter.storage
        storage.__setstate__(storage.__getstate__())  # fresh locks and expiry timer on this loop, same counts
        _memory_limiters[uri] = (limiter, weakref.ref(loop))
    return limiter


async def _retry_after(limiter: MovingWindowRateLimiter, item: RateLimitItem, *identifiers: str) -> int:
    stats = await limiter.get_window_stats(item, *identifiers)
    return max(1, math.ceil(stats.reset_time - time.time()))


async def connect_refusal(*, user_id: object, api_key_id: object | None) -> Refusal | None:
    """Count one authenticated connect, against its API key if it came with one, else its user; a
    Refusal once that is over its per-minute setting."""
    if api_key_id is not None:
        identity, per_minute, whose = ("key", str(api_key_id)), settings.PARLEY_CONNECTS_PER_KEY_PER_MINUTE, "API key"
    else:
        identity, per_minute, whose = ("user", str(user_id)), settings.PARLEY_CONNECTS_PER_USER_PER_MINUTE, "account"
    limiter, item = _current(), parse(f"{per_minute}/minute")
    if await limiter.hit(item, "parley", "connect", *identity):
        return None
    wait = await _retry_after(limiter, item, "parley", "connect", *identity)
    return Refusal(f"Too many connections with this {whose}; try again in {wait} s.", wait)


async def key_refusal(ip: str) -> Refusal | None:
    """A Refusal while ``ip`` is over ``PARLEY_KEY_FAILURE_RATE`` failed authentications (checked before any
    key lookup)."""
    limiter, item = _current(), parse(settings.PARLEY_KEY_FAILURE_RATE)
    if await limiter.test(item, "parley", "bad_key", ip):
        return None
    wait = await _retry_after(limiter, item, "parley", "bad_key", ip)
    return Refusal(
        f"Too many wrong API keys or unauthenticated connects from your address; try again in {wait} s.", wait
    )


async def record_key_failure(ip: str) -> None:
    """Count one failed authentication from ``ip`` (a wrong key, or a connect without credentials)."""
    await _current().hit(parse(settings.PARLEY_KEY_FAILURE_RATE), "parley", "bad_key", ip)


async def reset() -> None:
    """Forget every count (tests: each starts from zero)."""
    await _current().storage.reset()
