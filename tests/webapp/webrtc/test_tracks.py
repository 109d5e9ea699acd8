"""The outgoing track's queue: a backlog that stands goes in the agent's pauses, never during its words; a chunk
that comes a little late is waited for and sent late, not replaced by silence."""

from __future__ import annotations

import asyncio

import numpy as np

from webapp.webrtc.tracks import FRAME_BYTES, LATE_WAIT_MS, RATE, STANDING_WINDOW_PUSHES, AgentAudioTrack

CHUNK = RATE * 80 // 1000  # the echo and lockstep engines' 80 ms


def chunk(level: float) -> bytes:
    t = np.arange(CHUNK) / RATE
    return (level * 32767 * np.sin(2 * np.pi * 200 * t)).astype("<i2").tobytes()


def steady(track: AgentAudioTrack, chunks: list[bytes]) -> list[int]:
    """Push each chunk and take its four frames; the bytes queued just before each push."""
    depths = []
    for piece in chunks:
        depths.append(len(track._pending))
        track.push(piece)
        for _ in range(4):
            track._take()
    return depths


def test_a_standing_backlog_goes_in_a_pause_and_no_speech_is_dropped():
    track = AgentAudioTrack()
    track.push(chunk(0.3))
    track.push(chunk(0.3) * 2)  # a burst: what the steady flow needs and more (up to MAX_QUEUED_MS) stay queued
    loud = steady(track, [chunk(0.3)] * (2 * STANDING_WINDOW_PUSHES))
    assert min(loud[-STANDING_WINDOW_PUSHES:]) >= CHUNK * 2  # speech throughout: 80 ms and more stand
    assert track.stats.trimmed_ms == 0
    after = steady(track, [chunk(0.3)] * 4 + [chunk(0.0)] * 3 + [chunk(0.3)] * 8)  # a 240 ms pause
    assert track.stats.trimmed_ms >= 60
    assert after[-1] <= FRAME_BYTES
    assert track.stats.underruns == 0


def heard(frame) -> bool:
    """The frame carries the tone (its RMS is 0.21 of full scale), not silence with the resampler's few samples
    of the frame before."""
    pcm = frame.to_ndarray().astype(np.float64)
    return bool(np.sqrt(np.mean(pcm**2)) > 0.1 * 32767)


async def frames_around_a_late_chunk(late_ms: float) -> tuple[list[bool], AgentAudioTrack]:
    """Four frames of a first chunk, then the next chunk pushed ``late_ms`` after its first frame was due;
    whether each of the next frames carried the agent's audio."""
    track = AgentAudioTrack()
    track.push(chunk(0.3))
    first = [heard(await track.recv()) for _ in range(4)]
    due = track._next_at
    asyncio.get_running_loop().call_at(due + late_ms / 1000, track.push, chunk(0.3))
    return first + [heard(await track.recv()) for _ in range(5)], track


async def test_a_chunk_a_little_late_is_sent_late_not_replaced_by_silence():
    frames, track = await frames_around_a_late_chunk(LATE_WAIT_MS / 2)
    assert frames == [True] * 8 + [False]  # the late chunk's four frames, then nothing more was pushed
    assert track.stats.underruns == 1  # the last: the agent stopped
    # 1: the fifth frame waited for its chunk (0 only if the loop woke so late that the chunk was already there)
    assert track.stats.late_frames <= 1


async def test_a_chunk_later_than_the_wait_leaves_one_silent_frame_then_plays():
    frames, track = await frames_around_a_late_chunk(LATE_WAIT_MS * 2)
    assert frames[:5] == [True] * 4 + [False] and frames[-1]  # silence while nothing came, then the chunk
    assert track.stats.underruns == 1 and track.stats.late_frames == 0
