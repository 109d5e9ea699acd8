"""The outgoing track's queue: a backlog that stands goes in the agent's pauses, never during its words."""

from __future__ import annotations

import time

import numpy as np

from webapp.webrtc.tracks import FRAME_BYTES, RATE, STANDING_WINDOW_PUSHES, AgentAudioTrack

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
    time.sleep(0.04)  # the start slack
    track.push(chunk(0.3) * 2)  # a burst: what the steady flow needs and more (up to MAX_QUEUED_MS) stay queued
    loud = steady(track, [chunk(0.3)] * (2 * STANDING_WINDOW_PUSHES))
    assert min(loud[-STANDING_WINDOW_PUSHES:]) >= CHUNK * 2  # speech throughout: 80 ms and more stand
    assert track.stats.trimmed_ms == 0
    after = steady(track, [chunk(0.3)] * 4 + [chunk(0.0)] * 3 + [chunk(0.3)] * 8)  # a 240 ms pause
    assert track.stats.trimmed_ms >= 60
    assert after[-1] <= FRAME_BYTES + CHUNK * 2 // 4
    assert track.stats.underruns == 0
