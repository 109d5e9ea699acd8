"""Why a call ended, in words a caller understands (``session.closed`` reasons, docs/protocol.md).

The call page says the same in static/call/close-reasons.js: keep the two in step.
"""

from __future__ import annotations

CLOSE_REASON_WORDS = {
    "client_close": "You hung up.",
    "pause_timeout": "The call stayed paused too long, so it ended.",
    "grace_expired": "The connection was lost for too long, so the call ended.",
    "max_duration": "The call reached its maximum length.",
    "idle_timeout": "Nothing was said for a long time, so the call ended.",
    "admin_ended": "An administrator ended this call.",
    "engine_failed": "The model stopped working, so the call ended.",
    "replaced": "The call moved to another window or tab.",
    "shutdown": "The server was restarting, so the call ended.",
    "credentials_revoked": "Your access was withdrawn, so the call ended.",
    "superseded": "A newer call of yours replaced this one.",
}


def close_reason_words(reason: str) -> str:
    """The sentence for ``reason``; an unknown reason is still shown, with spaces for underscores."""
    if not reason:
        return ""
    return CLOSE_REASON_WORDS.get(reason, reason.replace("_", " ").capitalize() + ".")
