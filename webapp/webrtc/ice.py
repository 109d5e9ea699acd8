"""ICE servers: the part of the call page's list (webapp.calls.views hands it all) the server itself uses.

``PARLEY_ICE_SERVERS`` is a JSON list in the browser's ``RTCIceServer`` shape, e.g.
``[{"urls": "stun:turn.example.org:3478"}, {"urls": "turn:turn.example.org:3478?transport=udp",
"username": "parley", "credential": "..."}]`` (docs/deploy.md, "WebRTC: STUN and TURN"). The server
gathers with the STUN entries only: it answers from its own addresses (public, or learned through
STUN behind a 1:1 NAT), and a caller behind a strict NAT or firewall reaches it through the TURN relay.
"""

from __future__ import annotations

from aiortc import RTCIceServer
from django.conf import settings


def server_ice_servers() -> list[RTCIceServer]:
    servers = []
    for server in settings.PARLEY_ICE_SERVERS:
        urls = server["urls"] if isinstance(server["urls"], list) else [server["urls"]]
        stun = [url for url in urls if url.startswith("stun:")]
        if stun:
            servers.append(RTCIceServer(urls=stun))
    return servers
