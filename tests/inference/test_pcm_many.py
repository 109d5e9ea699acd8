"""encode_pcm16_many: the worker's one-pass PCM16 conversion of a tick's frames equals encode_pcm16 per frame."""

from __future__ import annotations

import numpy as np

from inference.audio.pcm import encode_pcm16, encode_pcm16_many


def test_one_pass_equals_per_frame_encoding_byte_for_byte():
    rng = np.random.default_rng(0)
    frames = [rng.uniform(-1.2, 1.2, 1920).astype(np.float32) for _ in range(5)]
    frames[1][:4] = [np.nan, np.inf, -np.inf, 0.99999]  # non-finite and out-of-range samples, as a codec may give
    frames[2] = frames[2].astype(np.float64)  # another dtype converts the same way
    assert encode_pcm16_many(frames) == [encode_pcm16(f) for f in frames]


def test_frames_of_different_lengths_fall_back_to_per_frame():
    frames = [np.full(1920, 0.5, dtype=np.float32), np.full(960, -0.25, dtype=np.float32)]
    assert encode_pcm16_many(frames) == [encode_pcm16(f) for f in frames]
    assert encode_pcm16_many([]) == []


def test_inputs_are_left_untouched():
    frame = np.linspace(-1, 1, 1920, dtype=np.float32)
    before = frame.copy()
    encode_pcm16_many([frame, frame])
    assert np.array_equal(frame, before)
