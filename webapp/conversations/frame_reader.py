"""A live call's binary audio frames read off the socket's bytes without autobahn's frame machine.

autobahn parses every incoming WebSocket frame in Python: ``dataReceived`` -> ``consumeData`` -> ``processData``
twice (the header, then the payload) with a dozen protocol checks, a masker object per frame, five frame and
message hooks, list joins and an observable ``fire`` per message: about 14 us a frame on this project's 2-core
machine, against a 12.5-frame-a-second caller. At 200 echo callers that parse was 16 % of one daphne's
interpreter samples, the largest single part of its loop (bench/notes/serving-e2e.md, "The frame reader").

The reader takes only what RFC 6455 (5.2) makes unambiguous and autobahn would hand to ``onMessage`` unchanged:
whole frames at the front of the received bytes that are final, binary, without RSV bits, masked (as every client
frame must be) and of a 16-bit length (126-65 535 bytes: every audio frame of 80 ms at the rates the protocol
allows), read while autobahn holds nothing (no buffered bytes, no frame or fragmented message under way) and its
options are the plain ones (no compression, no frame or octet logging, no timings, no listeners, masks applied,
within the size limits). It unmasks the payload and calls the protocol's ``onMessage`` as autobahn would, keeping
autobahn's traffic counters and its auto-ping rule. Everything else (text, control and close frames, fragments,
a frame cut across reads, anything odd) goes to autobahn from the first byte the reader did not take, so its
checks and failures are as before.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from webapp.operations.metrics import FRAMES_READ

# FIN + binary opcode; MASK + "a 16-bit length follows"; the length; the 4-byte mask.
HEADER = struct.Struct("!BBH4s")
FINAL_BINARY, MASKED_LENGTH16 = 0x82, 0x80 | 126
# What the reader reads of autobahn's protocol (autobahn.websocket.protocol.WebSocketProtocol, 26.x).
AUTOBAHN_STATE = ("state", "STATE_OPEN", "current_frame", "inside_message", "data", "_perMessageCompress",
                  "applyMask", "logOctets", "logFrames", "trackedTimings", "maxFramePayloadSize",
                  "maxMessagePayloadSize", "trafficStats", "autoPingTimeoutCall", "autoPingRestartOnAnyTraffic",
                  "_cancelAutoPingTimeoutCall", "dataReceived")  # fmt: skip


def unmask(data: bytes, start: int, length: int, mask: bytes) -> bytes:
    """``data[start:start + length]`` XOR the 4-byte ``mask`` repeated (RFC 6455 5.3)."""
    key = np.frombuffer(mask * ((length + 3) // 4), np.uint8, length)
    return (np.frombuffer(data, np.uint8, length, start) ^ key).tobytes()


class BinaryFrameReader:
    """Puts itself in front of one autobahn protocol's ``dataReceived`` until ``remove``."""

    def __init__(self, protocol: Any):
        self.protocol = protocol
        protocol.dataReceived = self._data_received  # the instance's, in front of autobahn's class method

    @classmethod
    def install(cls, protocol: Any) -> BinaryFrameReader | None:
        """The reader on ``protocol``, or None (autobahn reads everything) when it is not the autobahn this knows."""
        if not all(hasattr(protocol, name) for name in AUTOBAHN_STATE):
            return None
        return cls(protocol)

    def _plain(self) -> bool:
        """autobahn holds nothing and runs with the options under which the reader does what it would."""
        p = self.protocol
        return (
            p.state == p.STATE_OPEN
            and p.current_frame is None
            and not p.inside_message
            and not p.data
            and p._perMessageCompress is None
            and p.applyMask
            and not (p.logOctets or p.logFrames or p.trackedTimings)
            and getattr(p, "_listeners", None) is None  # autobahn fires "message" to listeners; the reader cannot
        )

    def _data_received(self, data: bytes) -> None:
        p = self.protocol
        taken = 0
        if self._plain():
            limit = min(size for size in (p.maxFramePayloadSize, p.maxMessagePayloadSize, 0xFFFF) if size > 0)
            end = len(data)
            while end - taken >= HEADER.size and p.state == p.STATE_OPEN:
                first, second, length, mask = HEADER.unpack_from(data, taken)
                if first != FINAL_BINARY or second != MASKED_LENGTH16 or not 126 <= length <= limit:
                    break
                start = taken + HEADER.size
                if end - start < length:
                    break  # cut across reads: autobahn buffers it
                taken = start + length
                self._count(HEADER.size + length, length)
                p.onMessage(unmask(data, start, length, mask), True)
        if taken < len(data):
            type(p).dataReceived(p, data[taken:] if taken else data)

    def _count(self, wire_bytes: int, payload_bytes: int) -> None:
        """What autobahn's parse of the same frame adds to its counters, and its ping rule for any data frame."""
        p = self.protocol
        stats = p.trafficStats
        stats.incomingOctetsWireLevel += wire_bytes
        stats.incomingOctetsWebSocketLevel += payload_bytes
        stats.incomingOctetsAppLevel += payload_bytes
        stats.incomingWebSocketFrames += 1
        stats.incomingWebSocketMessages += 1
        if p.autoPingTimeoutCall and p.autoPingRestartOnAnyTraffic:
            p._cancelAutoPingTimeoutCall()
        FRAMES_READ["reader"] += 1

    def remove(self) -> None:
        """autobahn's own ``dataReceived`` again."""
        self.protocol.__dict__.pop("dataReceived", None)
