"""Why a ``/v1/realtime`` socket is refused before any session is opened, read from its scope alone.

The consumer accepts every socket and then says why it closes (a refused handshake has no reason a browser can
read): this process at its load (``common.loop_load``), the connect limit (``conversations.auth``), or no valid
credential. Each refusal is the error event to send and the close code after it (docs/protocol.md).
"""

from __future__ import annotations

from typing import Any

from webapp.common import loop_load
from webapp.conversations import protocol as p
from webapp.conversations.close_codes import CloseCode

UNAUTHENTICATED_MESSAGES = {  # a credential was sent (see conversations.auth): say that it is what is wrong
    "api_key": "This API key is not valid: it is mistyped, revoked, or its user is deactivated.",
    "client_secret": "This client secret is not valid: it is expired, already used, or its key revoked.",
}


def refusal_at_connect(scope: dict[str, Any]) -> tuple[p.ProtocolError, int] | None:
    """The error and close code that refuse this socket, or None when it may ask for a session."""
    if busy := scope.get(loop_load.SCOPE_KEY):  # this process is at its load (see common.loop_load)
        return p.ProtocolError("resource_exhausted", busy, error_type="rate_limit_error"), CloseCode.QUEUE_FULL
    if throttled := scope.get("throttled"):  # accepted only to say why (see conversations.auth)
        error = p.ProtocolError("rate_limit_exceeded", throttled.message, error_type="rate_limit_error")
        return error, CloseCode.RATE_LIMITED
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        message = UNAUTHENTICATED_MESSAGES.get(
            scope.get("auth_method"), "Authentication required: log in or send an API key."
        )
        return p.ProtocolError("forbidden", message), CloseCode.UNAUTHENTICATED
    return None
