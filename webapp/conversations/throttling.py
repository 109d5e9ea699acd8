"""Per-client-IP limits: connects to ``/v1/realtime``, and wrong API keys wherever a key is accepted
(the realtime handshake, ``/ops/metrics``), with the ``limits`` library.

Counts live in ``settings.PARLEY_RATE_LIMIT_STORAGE``: Redis when the deployment has one (every web
process shares the counts), else this process's memory. Rates use the library's notation
(``PARLEY_CONNECT_RATE=30/minute``). A refused client is told so by the consumer: an ``error``
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
    """The peer address daphne reports (the forwarded one when it runs with --proxy-headers)."""
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


async def connect_refusal(ip: str) -> Refusal | None:
    """Count one connect from ``ip``; a Refusal once it is over ``PARLEY_CONNECT_RATE``."""
    limiter, item = _current(), parse(settings.PARLEY_CONNECT_RATE)
    if await limiter.hit(item, "parley", "connect", ip):
        return None
    wait = await _retry_after(limiter, item, "parley", "connect", ip)
    return Refusal(f"Too many connections from your address; try again in {wait} s.", wait)


async def key_refusal(ip: str) -> Refusal | None:
    """A Refusal while ``ip`` is over ``PARLEY_KEY_FAILURE_RATE`` wrong keys (checked before any lookup)."""
    limiter, item = _current(), parse(settings.PARLEY_KEY_FAILURE_RATE)
    if await limiter.test(item, "parley", "bad_key", ip):
        return None
    wait = await _retry_after(limiter, item, "parley", "bad_key", ip)
    return Refusal(f"Too many wrong API keys from your address; try again in {wait} s.", wait)


async def record_key_failure(ip: str) -> None:
    await _current().hit(parse(settings.PARLEY_KEY_FAILURE_RATE), "parley", "bad_key", ip)


async def reset() -> None:
    """Forget every count (tests: each starts from zero)."""
    await _current().storage.reset()
