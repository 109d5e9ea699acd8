"""Daphne with the server's audio path traced (bench/latency_browser.py ``--trace``): a probe, not a server.

Wraps ``TickAlignedFramer.push`` / ``take`` and ``Outbox.put`` / ``__anext__`` so that every push (time,
samples), every take (time, FIFO depth before and after, samples taken, short or empty, margin, samples
dropped so far), every audio event's wait in the outbox and, for WebRTC, the outgoing track's depth at
each push and frame and the caller's decoded audio go to ``$PARLEY_TRACE_PATH`` as JSON lines
(monotonic seconds). ``bench/latency_trace.py`` turns them, with the page's per-second figures, into
where the delay accumulates. Nothing in the served code changes; the wrappers only record.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np

from inference.audio import framing
from inference.session import outbox

_out = open(os.environ["PARLEY_TRACE_PATH"], "a", buffering=1)  # noqa: SIM115 - open for the process's life
_lock = threading.Lock()


def loud_at(samples) -> int | None:
    """Index of the first sample above 0.3 full scale (bench/impairment.py's marker peaks at 0.55, its tone at
    0.15), or None: where a marker passes each stage."""
    x = np.abs(np.frombuffer(samples, "<i2") / 32767 if isinstance(samples, bytes | bytearray) else samples)
    hits = np.flatnonzero(x > 0.3)
    return int(hits[0]) if len(hits) else None


def _write(record: dict) -> None:
    with _lock:
        _out.write(json.dumps(record) + "\n")


_push, _take = framing.TickAlignedFramer.push, framing.TickAlignedFramer.take


def push(self, samples):
    overflow = _push(self, samples)
    _write(
        {
            "k": "push",
            "t": time.monotonic(),
            "n": int(len(samples)),
            "depth": self._size,
            "overflow": overflow,
            "m": loud_at(samples),
        }
    )
    return overflow


def take(self):
    before, dropped, margin = self._size, self.dropped, self.margin
    frame = _take(self)
    _write(
        {
            "k": "take",
            "t": time.monotonic(),
            "before": before,
            "after": self._size,
            "got": None if frame is None else before - self._size - (self.dropped - dropped),
            "short": None if frame is None else frame.short,
            "margin": margin,
            "margin_after": self.margin,
            "dropped": self.dropped,
            "trimmed": self.dropped - dropped,
            "mode": self._mode,
        }
    )
    return frame


framing.TickAlignedFramer.push, framing.TickAlignedFramer.take = push, take

_put, _next = outbox.Outbox.put, outbox.Outbox.__anext__


def put(self, event):
    if isinstance(event, outbox.AudioOut):
        _write({"k": "out_put", "t": time.monotonic(), "queued": len(self)})
    return _put(self, event)


async def anext_(self):
    event = await _next(self)
    if isinstance(event, outbox.AudioOut):
        _write({"k": "out_take", "t": time.monotonic(), "queued": len(self)})
    return event


outbox.Outbox.put, outbox.Outbox.__anext__ = put, anext_

# WebRTC: the agent's audio into the outgoing track (depth before the push, in samples), each 20 ms frame out
# (what still waits after it, whether the track was playing), and the caller's decoded audio on its way in.
# (call.py imports Django models, so its name for pump_caller_audio is patched here, before it is imported.)
from webapp.webrtc import tracks  # noqa: E402

_track_push, _track_take, _pump = tracks.AgentAudioTrack.push, tracks.AgentAudioTrack._take, tracks.pump_caller_audio


def track_push(self, pcm16):
    _write(
        {
            "k": "track_push",
            "t": time.monotonic(),
            "n": len(pcm16) // 2,
            "depth": len(self._pending) // 2,
            "m": loud_at(pcm16),
        }
    )
    return _track_push(self, pcm16)


def track_take(self):
    piece = _track_take(self)
    record = {"k": "track_take", "t": time.monotonic(), "depth": len(self._pending) // 2, "playing": self._playing}
    _write({**record, "m": loud_at(piece)})
    return piece


async def pump_caller_audio(track, deliver, stats):
    async def traced(pcm16):
        _write({"k": "rtc_in", "t": time.monotonic(), "n": len(pcm16) // 2, "m": loud_at(pcm16)})
        await deliver(pcm16)

    return await _pump(track, traced, stats)


tracks.AgentAudioTrack.push, tracks.AgentAudioTrack._take = track_push, track_take
tracks.pump_caller_audio = pump_caller_audio

if __name__ == "__main__":
    from daphne.cli import CommandLineInterface

    sys.argv[0] = "daphne"
    CommandLineInterface.entrypoint()
