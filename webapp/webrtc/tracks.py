"""The two audio paths of a WebRTC call: the caller's Opus track in, the agent's Opus track out.

Inside, audio is what the WebSocket carries: pcm16 mono at the engine's rate (24 kHz). aiortc decodes
the caller's Opus at 48 kHz, and its encoder takes any rate but resamples into 20 ms frames through a
FIFO: the resampler's filter delay leaves each 24 kHz frame a few samples short of a whole 48 kHz frame,
so every packet went out one frame (20 ms) after its audio was taken. Both ways are resampled here, and
the agent's frames reach the encoder at 48 kHz, whole (``WholeFrameResampler``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from inference.api import QUIET_RMS  # the input framer's: only audio this quiet is ever trimmed

logger = logging.getLogger(__name__)

RATE = 24_000  # the engine's rate (EngineCapabilities.input_rate / output_rate of every engine today)
OPUS_RATE = 48_000
FRAME_MS = 20  # one Opus packet
FRAME_SAMPLES = RATE * FRAME_MS // 1000
FRAME_BYTES = FRAME_SAMPLES * 2
# The agent's audio comes in the engine's chunks (80 ms for a lockstep or echo engine, 1 s units for the unit
# engine) on the engine's clock; the track sends 20 ms every 20 ms. When the next chunk is late (the engine's
# tick, the event loop), the track waits up to this long for it and sends it late, its time stamp unchanged, and
# the frames after it 20 ms apart from it: the receiver's jitter buffer absorbs that lateness with the network's.
# Keeping a frame standing here instead (as before) put 20 ms, plus 0-20 ms of the clock's phase against the
# chunks, on every frame of every call. The unit engine, which sends nothing while it listens, pays the wait
# once at the end of each spoken run (one silent frame sent that much late).
LATE_WAIT_MS = 40
# More than this waiting (a burst at the start, or a stall that let chunks pile up) is dropped from the
# oldest: an 80 ms chunk and a frame is all that ever needs to wait, and what waits beyond it would stay
# on as delay for the rest of the call (the unit engine's 1 s units are pushed as they come, in 80 ms pieces).
MAX_QUEUED_MS = 200
# What stood in the queue at every push of a window (about 1 s of 80 ms chunks) is a backlog that the steady
# flow keeps for good (a stall let chunks pile up, or a burst came at the start): it is dropped, from the
# oldest, as soon as that audio is quiet (as the input framer does: never the agent's words).
STANDING_WINDOW_PUSHES = 12
# The caller's stream is kept in time: a gap in its RTP timestamps (lost packets) shorter than this is
# filled with silence; a longer one is a pause of the sender, not lost audio.
MAX_CONCEALED_GAP_MS = 500


@dataclass
class DownlinkStats:
    sent_ms: int = 0  # agent audio sent (the silence sent while none waited is not counted): playback.ack
    underruns: int = 0  # the buffer ran dry while the agent was sending, and stayed dry for LATE_WAIT_MS
    late_frames: int = 0  # frames sent late because their chunk came late (waited for, not replaced by silence)
    dropped_ms: int = 0  # dropped from the oldest beyond MAX_QUEUED_MS
    trimmed_ms: int = 0  # standing backlog dropped while quiet


class WholeFrameResampler:
    """Frames in, mono pcm16 of the same duration out at ``rate``, with nothing held back.

    A resampler's output trails its input by its filter delay (well under a millisecond), so each output
    falls a few samples short of its frame and cutting whole frames from it waits for the next one (20 ms).
    Here the first output is padded in front by that much instead, and every frame out carries the frame
    that came in with it."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
        self._pending = bytearray()

    def resample(self, frame: av.AudioFrame) -> bytes:
        for out in self._resampler.resample(frame):
            self._pending += bytes(out.planes[0])[: out.samples * 2]
        want = frame.samples * self.rate // frame.sample_rate * 2
        if len(self._pending) < want:
            self._pending[:0] = bytes(want - len(self._pending))
        piece = bytes(self._pending[:want])
        del self._pending[:want]
        return piece


def pcm16_frame(pcm16: bytes, rate: int, pts: int) -> av.AudioFrame:
    """A mono pcm16 ``av.AudioFrame`` with its time stamp."""
    frame = av.AudioFrame(format="s16", layout="mono", samples=len(pcm16) // 2)
    frame.planes[0].update(pcm16)
    frame.sample_rate, frame.pts, frame.time_base = rate, pts, fractions.Fraction(1, rate)
    return frame


class AgentAudioTrack(MediaStreamTrack):
    """Outgoing audio: 20 ms frames on the wall clock (48 kHz pcm16) from a 24 kHz queue the session fills."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pending = bytearray()
        self._playing = False  # the agent is sending: a dry buffer is a late chunk, waited for
        self._next_at: float | None = None
        self._pts = 0
        self._upsampler = WholeFrameResampler(OPUS_RATE)
        self._window_pushes = 0
        self._window_min = 1 << 62  # the least queued (bytes) at a push of this window while playing
        self._waiting_trim = 0  # bytes the last window found standing, dropped when they are quiet
        self._audio_arrived = asyncio.Event()
        self.stats = DownlinkStats()

    def push(self, pcm16: bytes) -> None:
        """Queue the agent's audio (any length, whole samples)."""
        if not pcm16:
            return
        if self._playing:
            self._watch_standing()
        self._pending += pcm16
        self._audio_arrived.set()
        excess = len(self._pending) - MAX_QUEUED_MS * RATE * 2 // 1000
        if excess > 0:
            excess += excess % 2
            del self._pending[:excess]
            self.stats.dropped_ms += excess * 1000 // (RATE * 2)

    def flush(self) -> None:
        """Barge-in or pause: what waits is not heard."""
        self._pending.clear()
        self._playing = False
        self._new_window()

    def _watch_standing(self) -> None:
        self._window_min = min(self._window_min, len(self._pending))
        self._window_pushes += 1
        if self._window_pushes >= STANDING_WINDOW_PUSHES:
            standing = self._window_min
            self._new_window()
            self._waiting_trim = max(0, standing - standing % 2)

    def _new_window(self) -> None:
        self._window_pushes, self._window_min, self._waiting_trim = 0, 1 << 62, 0

    def _trim_when_quiet(self) -> None:
        trim = min(self._waiting_trim, len(self._pending) - FRAME_BYTES)
        trim -= trim % 2
        if trim <= 0:
            return
        head = np.frombuffer(self._pending, "<i2", count=trim // 2).astype(np.float32)
        if float(np.dot(head, head)) < (QUIET_RMS * 32767) ** 2 * len(head):
            del self._pending[:trim]
            self.stats.trimmed_ms += trim * 1000 // (RATE * 2)
            self._waiting_trim = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._next_at is None:
            await self._first_audio()
        now = time.monotonic()
        if self._next_at is None or now - self._next_at > 0.2:  # first frame, or the loop stalled: re-anchor
            self._next_at = now
        else:
            await asyncio.sleep(max(0.0, self._next_at - now))
        if self._playing and len(self._pending) < FRAME_BYTES and await self._audio_for(FRAME_BYTES, LATE_WAIT_MS):
            self.stats.late_frames += 1
            self._next_at = time.monotonic()  # the frames after it go 20 ms apart from it
        self._next_at += FRAME_MS / 1000
        pcm = self._upsampler.resample(pcm16_frame(self._take(), RATE, self._pts))
        frame = pcm16_frame(pcm, OPUS_RATE, self._pts * (OPUS_RATE // RATE))
        self._pts += FRAME_SAMPLES
        return frame

    async def _first_audio(self) -> None:
        """The stream starts with the agent's first audio, not with the connection.

        A receiver's jitter buffer sets its playout delay from the first packets. The first frames of a call came
        out 35-55 ms late (the call's own start holds the event loop: the consumer, the session, the first
        encode), the next ones on time, and the caller's playout, anchored on the late ones, stayed that much
        behind for the rest of the call (impairment bench at 7aa6a2c: the first packet heard 80 ms behind the
        stream's steady pace). Silence sent before anything was said carried nothing."""
        await self._audio_for(1)
        if self.readyState != "live":
            raise MediaStreamError

    async def _audio_for(self, nbytes: int, within_ms: float | None = None) -> bool:
        """Wait until ``nbytes`` are queued (for at most ``within_ms``; None: until the track ends); whether they
        are. The wait wakes every 250 ms at least to notice the track ending."""
        deadline = None if within_ms is None else time.monotonic() + within_ms / 1000
        while len(self._pending) < nbytes and self.readyState == "live":
            left = 0.25 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            self._audio_arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._audio_arrived.wait(), min(left, 0.25))
        return len(self._pending) >= nbytes

    def _take(self) -> bytes:
        if not self._playing and self._pending:
            self._playing = True
        if self._waiting_trim and self._playing:
            self._trim_when_quiet()
        if not self._playing:
            return bytes(FRAME_BYTES)
        if len(self._pending) < FRAME_BYTES:
            self.stats.underruns += 1
            self._playing = False
            self._new_window()
            piece = bytes(self._pending) + bytes(FRAME_BYTES - len(self._pending))
            self.stats.sent_ms += len(self._pending) * 1000 // (RATE * 2)
            self._pending.clear()
            return piece
        piece = bytes(self._pending[:FRAME_BYTES])
        del self._pending[:FRAME_BYTES]
        self.stats.sent_ms += FRAME_MS
        return piece


@dataclass
class UplinkStats:
    received_ms: int = 0
    concealed_ms: int = 0  # silence put in for lost packets, keeping the caller's stream in time


async def pump_caller_audio(
    track: MediaStreamTrack, deliver: Callable[[bytes], Awaitable[None]], stats: UplinkStats
) -> None:
    """Decode the caller's track into 24 kHz mono pcm16 and hand each piece to ``deliver`` until it ends."""
    resampler = WholeFrameResampler(RATE)  # each 20 ms packet stays one piece of the session's stream
    expected_pts: int | None = None  # in the decoded frames' time base (1/sample_rate)
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        rate = frame.sample_rate
        if expected_pts is not None and frame.pts is not None:
            gap = frame.pts - expected_pts
            if 0 < gap <= rate * MAX_CONCEALED_GAP_MS // 1000:
                gap_samples = gap * RATE // rate
                stats.concealed_ms += gap_samples * 1000 // RATE
                await deliver(bytes(gap_samples * 2))
        if frame.pts is not None:
            expected_pts = frame.pts + frame.samples
        stats.received_ms += frame.samples * 1000 // rate
        pcm = resampler.resample(frame)
        if pcm:
            await deliver(pcm)
