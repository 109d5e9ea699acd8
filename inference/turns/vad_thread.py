"""One thread per process runs every session's voice activity detection, off the event loop.

Silero costs about 1-2 ms of CPU per 32 ms window on a busy 2-core host, too much to run inline on the
service's event loop for many calls. Sessions hand audio in through a bounded queue, in order; what the
detector finds goes back to the session's loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable

import numpy as np

from inference.contracts import TurnDetection
from inference.turns.detector import SpeechStart, SpeechStop, TurnDetector
from inference.turns.vad import WINDOW_MS, SileroVad

logger = logging.getLogger(__name__)
QUEUE_MAX = 4096  # pieces of audio waiting (about 80 s of 20 ms appends): a stalled thread shows up as drops

Found = Callable[[list[SpeechStart | SpeechStop]], None]


class VadStream:
    """One session's detector: a Silero state and the server_vad state machine over it."""

    def __init__(self, config: TurnDetection, loop: asyncio.AbstractEventLoop, found: Found):
        self.detector = TurnDetector(config, WINDOW_MS)
        self.loop, self.found = loop, found
        self.closed = False
        self._vad: SileroVad | None = None  # loaded on the VAD thread (tens of ms)

    def run(self, samples: np.ndarray) -> None:
        if self._vad is None:
            self._vad = SileroVad()
        events = [e for p in self._vad.probabilities(samples) if (e := self.detector.feed(p)) is not None]
        if events and not self.closed and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._deliver, events)

    def _deliver(self, events: list[SpeechStart | SpeechStop]) -> None:
        if not self.closed:
            self.found(events)


class VadThread:
    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[VadStream, np.ndarray]] = queue.Queue(QUEUE_MAX)
        self.dropped = 0
        threading.Thread(target=self._run, name="vad", daemon=True).start()

    def submit(self, stream: VadStream, samples: np.ndarray) -> None:
        try:
            self._jobs.put_nowait((stream, samples))
        except queue.Full:
            self.dropped += 1
            logger.warning("vad.queue_full", extra={"dropped": self.dropped})

    def _run(self) -> None:
        while True:
            stream, samples = self._jobs.get()
            if stream.closed:
                continue
            try:
                stream.run(samples)
            except Exception:  # noqa: BLE001 - one stream's fault must not stop every session's VAD
                logger.exception("vad.failed")
                stream.closed = True


_thread: VadThread | None = None
_lock = threading.Lock()


def vad_thread() -> VadThread:
    global _thread
    with _lock:
        if _thread is None:
            _thread = VadThread()
        return _thread
