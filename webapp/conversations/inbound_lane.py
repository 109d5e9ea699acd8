"""A live call's binary audio frames from daphne's protocol straight into its session: no queue, no task wake-up.

A caller sends 12.5 binary audio frames a second. Through the ordinary path each one went onto the socket's
application queue (daphne's ``onMessage``), woke the consumer's task, resumed it through every ASGI middleware's
coroutine, went through the dispatch loop, channels' ``websocket_receive``, ``receive`` and its fault edge, and
then cost a fair-share yield of the loop: two loop steps and about fifteen frames of Python for one
``append``. At 200 echo callers on 2 cores that path was about a tenth of the web process's interpreter time
(bench/notes/serving-e2e.md, "The inbound lane").

The lane takes a binary frame only where the ordinary path would do exactly the same with it: nothing of this
socket waits on the queue or is being dispatched (so a frame never passes a text event sent before it, such as a
``session.update`` that changes the input format), the session is ready, and the handle can append without
waiting (``SessionHandle.append_audio_now``). Everything else (text events, a frame before the session is ready,
one the session refuses, a link to the service that is behind) takes the ordinary path, which answers it as
before: a refused frame is refused there again, with its error event.

Below the lane, ``frame_reader`` parses the call's plain binary frames off the socket's bytes itself, past
autobahn's frame machine; it hands them to the same ``onMessage``, so the rules above hold for them too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from webapp.conversations.frame_reader import BinaryFrameReader

TakeAudio = Callable[[bytes], bool]  # a binary frame into the session now: True when taken, False to queue it


class InboundLane:
    """Puts itself in front of one daphne WebSocket protocol's ``onMessage`` until ``remove``."""

    def __init__(self, protocol: Any, take_audio: TakeAudio):
        self.protocol = protocol
        self.take_audio = take_audio
        protocol.onMessage = self._on_message  # the instance's, in front of daphne's class method
        self.reader = BinaryFrameReader.install(protocol)

    @classmethod
    def install(cls, protocol: Any, take_audio: TakeAudio) -> InboundLane | None:
        """The lane on ``protocol``, or None (the ordinary path only) when it is not the daphne this knows."""
        if not all(hasattr(protocol, name) for name in ("application_queue", "muted", "last_ping", "onMessage")):
            return None
        return cls(protocol, take_audio)

    def _on_message(self, payload: bytes, is_binary: bool) -> None:
        p = self.protocol
        if is_binary and not p.muted and p.application_queue.empty() and self.take_audio(payload):
            p.last_ping = time.time()  # as daphne's onMessage: a message heard is as good as a ping answered
            return
        type(p).onMessage(p, payload, is_binary)

    def remove(self) -> None:
        """daphne's own ``onMessage`` again, and no reference from the protocol back to the consumer."""
        self.protocol.__dict__.pop("onMessage", None)
        if self.reader is not None:
            self.reader.remove()
