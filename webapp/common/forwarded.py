"""The client's address behind a proxy: ``X-Forwarded-For`` is believed only from configured proxies.

Every per-IP limit (login lockouts, the connect and wrong-key throttles, ``/ops/metrics``) reads the
address from ``scope["client"]`` (Django's ``REMOTE_ADDR``). daphne's ``--proxy-headers`` put the
leftmost ``X-Forwarded-For`` entry there, which the client writes itself, so a random header per
request escaped every limit. Here the header counts only when the peer is one of
``PARLEY_TRUSTED_PROXIES``, and then the client is the rightmost entry that is not a trusted proxy:
each proxy appends the address it saw, so everything left of that entry is the client's own words.
daphne must run without ``--proxy-headers`` (deploy/systemd), so that the peer here is the real one.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

from django.conf import settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@functools.lru_cache(maxsize=8)
def _networks(trusted: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in trusted)


def _trusted(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def client_address(peer: str, forwarded_for: Iterable[str], trusted: Iterable[str]) -> str:
    """The client's address: ``peer`` unless it is a trusted proxy, else the rightmost untrusted hop.

    ``forwarded_for``: the ``X-Forwarded-For`` header values in the order received. When every hop
    is a trusted proxy, the leftmost one is the client (a request from the proxy's own host).
    """
    networks = _networks(tuple(trusted))
    if not _trusted(peer, networks):
        return peer
    hops = [hop.strip() for value in forwarded_for for hop in value.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, networks):
            return hop[:64]  # the nearest address no trusted proxy vouches beyond (bounded: it keys counters)
    return hops[0] if hops else peer


class TrustedProxyMiddleware:
    """ASGI: rewrites ``scope["client"]`` for HTTP and WebSocket alike, before anything reads it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and scope.get("client"):
            peer, port = scope["client"][0], scope["client"][1]
            values = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == b"x-forwarded-for"]
            address = client_address(str(peer), values, settings.PARLEY_TRUSTED_PROXIES) if values else peer
            if address != peer:
                scope = {**scope, "client": [address, port]}
        return await self.app(scope, receive, send)
