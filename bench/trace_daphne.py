"""Daphne with the server's audio path traced (bench/latency_browser.py ``--trace``): a probe, not a server.

Wraps ``TickAlignedFramer.push`` / ``take`` and ``Outbox.put`` / ``__anext__`` so that every push (time,
samples), every take (time, FIFO depth before and after, samples taken, short or empty, margin, samples
dropped so far) and every audio event's wait in the outbox go to ``$PARLEY_TRACE_PATH`` as JSON lines
(monotonic seconds). ``bench/latency_trace.py`` turns them, with the page's per-second figures, into
where the delay accumulates. Nothing in the served code changes; the wrappers only record.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from inference.audio import framing
from inference.session import outbox

_out = open(os.environ["PARLEY_TRACE_PATH"], "a", buffering=1)  # noqa: SIM115 - open for the process's life
_lock = threading.Lock()


def _write(record: dict) -> None:
    with _lock:
        _out.write(json.dumps(record) + "\n")


_push, _take = framing.TickAlignedFramer.push, framing.TickAlignedFramer.take


def push(self, samples):
    overflow = _push(self, samples)
    _write({"k": "push", "t": time.monotonic(), "n": int(len(samples)), "depth": self._size, "overflow": overflow})
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

if __name__ == "__main__":
    from daphne.cli import CommandLineInterface

    sys.argv[0] = "daphne"
    CommandLineInterface.entrypoint()
