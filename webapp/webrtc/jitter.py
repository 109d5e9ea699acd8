"""A receive buffer for Opus that never waits for a lost packet.

aiortc's audio receiver releases packets in sequence order through ``JitterBuffer(capacity=16,
prefetch=4)``: it holds four packets (80 ms) before the first release, and a lost packet stops every
later one until sixteen more have arrived (320 ms), which then come out in a burst. On a lossy network
that turned each lost packet into a third of a second of the caller's silence followed by a backlog.
Here a packet is released as it arrives: one ahead of the next expected skips the missing ones (the
caller's stream fills them with silence, ``tracks.pump_caller_audio``), and one behind it (late or
duplicated) is dropped. Opus sends one packet per 20 ms frame, so a packet is a frame.
"""

from __future__ import annotations

from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add

_HALF = 1 << 15


class ArrivalOrderBuffer(JitterBuffer):
    def __init__(self) -> None:
        super().__init__(capacity=16)
        self.next_sequence: int | None = None
        self.skipped = 0  # packets never seen when a later one came
        self.late = 0  # packets that came after a later one had been released

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        sequence = packet.sequence_number
        if self.next_sequence is not None:
            ahead = uint16_add(sequence, -self.next_sequence)  # 0 .. 65535, modulo 2**16
            if ahead >= _HALF:  # behind: late or a duplicate
                self.late += 1
                return False, None
            self.skipped += ahead
        self.next_sequence = uint16_add(sequence, 1)
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)


def release_on_arrival(pc) -> None:
    """Give every audio receiver of ``pc`` an ``ArrivalOrderBuffer`` (before media flows)."""
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.receiver._RTCRtpReceiver__jitter_buffer = ArrivalOrderBuffer()
