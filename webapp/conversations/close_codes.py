"""The WebSocket close codes of ``/v1/realtime`` (docs/protocol.md), and which code ends which session."""

from __future__ import annotations


class CloseCode:
    """WebSocket close codes the endpoint uses (see docs/protocol.md).

    daphne (autobahn) sends only 1000 and 3000-4999: any other code raises inside it and the client
    gets 1011 or 1006 instead. So the standard codes' meanings live in the application range, as
    4000 + the standard code's last digits (1011 -> 4011), or 4000 + the HTTP status (4401, 4429).
    """

    NORMAL = 1000
    GOING_AWAY = 4001  # the server is shutting down (RFC 6455's 1001)
    POLICY = 4008  # the session could not be opened for another reason than capacity (1008)
    SERVER_ERROR = 4011  # engine_failed / internal_error ended the session (1011)
    QUEUE_FULL = 4013  # resource_exhausted: no slot and the queue is full; try again later (1013)
    UNAUTHENTICATED = 4401
    REPLACED = 4409  # another connection of the same user took the session over
    RATE_LIMITED = 4429  # rate_limit_exceeded: too many connects or failed authentications (HTTP 429)


CLOSE_CODE_BY_REASON = {  # how a session that ended closes its socket (else NORMAL)
    "engine_failed": CloseCode.SERVER_ERROR,
    "shutdown": CloseCode.GOING_AWAY,
    "credentials_revoked": CloseCode.UNAUTHENTICATED,
}


# A session that could not be opened: how the socket closes, by the error's code (else POLICY).
CONNECT_CLOSE_CODES = {"resource_exhausted": CloseCode.QUEUE_FULL, "engine_failed": CloseCode.SERVER_ERROR}
