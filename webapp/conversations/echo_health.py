"""Whether the caller's speakers feed the agent back into their microphone, in plain words (``session.status``).

The inference session measures a window of the live call every few seconds (inference/session/echo_watch.py)
and puts the result in that second's ``session.metrics`` (``echo_flagged``, ``echo_leak_db``,
``echo_delay_ms``). The leak is the complaint users of duplex systems raise first: the agent hears itself and
answers or interrupts itself. This turns the windows into at most one status change: ``echo_leak`` at the first
flagged window, ``echo_gone`` once several windows in a row found none. docs/protocol.md documents the event.
"""

from __future__ import annotations

from collections.abc import Mapping

from webapp.conversations.server_health import Status

LEAKING = "Your microphone picks up the agent's voice from your speakers: use headphones."
GONE = "The agent no longer hears itself through your microphone."
CLEAN_WINDOWS_TO_CLEAR = 3  # about 15 s without a leak (one window every 5 s)


class EchoHealth:
    """Follows one call's echo windows; ``update`` returns a Status when the caller should be told."""

    def __init__(self) -> None:
        self.leaking = False
        self.clean_windows = 0

    def update(self, metrics: Mapping[str, float]) -> Status | None:
        if "echo_flagged" not in metrics:
            return None  # no window was measured this second
        if metrics["echo_flagged"]:
            self.clean_windows = 0
            if not self.leaking:
                self.leaking = True
                return Status("warning", "echo_leak", LEAKING)
            return None
        self.clean_windows += 1
        if self.leaking and self.clean_windows >= CLEAN_WINDOWS_TO_CLEAR:
            self.leaking = False
            return Status("ok", "echo_gone", GONE)
        return None
