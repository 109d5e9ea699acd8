"""The session's log-mel kept across units (streaming_mel.MelCache) against recomputing the whole buffer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference.models.minicpmo.audio_encoder import (
    CORE_FRAMES,
    MEL_SLIDE_TRIGGER,
    UNIT_SAMPLES,
    AudioStreamState,
    MelFrontEnd,
)
from inference.models.minicpmo.streaming_mel import PAD, MelCache, padded_slice


@pytest.mark.parametrize(("lo", "hi"), [(0, 600), (0, 200), (150, 250), (7000, 9000), (9500, 10400), (0, 10400)])
def test_padded_slice_is_the_reflect_padded_buffer(lo, hi):
    buffer = np.random.default_rng(1).normal(size=10000).astype(np.float32)
    assert np.array_equal(padded_slice(buffer, lo, hi), np.pad(buffer, PAD, mode="reflect")[lo:hi])


def _session_units(seconds: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    t = np.arange(UNIT_SAMPLES) / 16000
    # loud and quiet seconds, so the buffer's peak (the dynamic floor) moves as the buffer grows and slides
    return [
        (rng.normal(0, 0.05 * (1 + u % 7), UNIT_SAMPLES) + 0.3 * np.sin(2 * np.pi * (200 + 37 * u) * t)).astype(
            np.float32
        )
        for u in range(seconds)
    ]


def test_kept_log_mel_equals_a_blockwise_recomputation_bit_for_bit_through_a_slide(minicpmo_parts):
    """Every unit, the kept cache holds exactly what recomputing the whole buffer block by block gives, also
    after the 30 s buffer slides (block 0 is recomputed then, the others move)."""
    audio = minicpmo_parts.audio
    front_end = audio.front_end
    state = AudioStreamState()
    slid = 0
    for samples in _session_units(MEL_SLIDE_TRIGGER // UNIT_SAMPLES + 14):
        before = state.buffer_base_frame
        mel = audio._unit_mel(state, audio._append_audio(state, samples))
        slid += state.buffer_base_frame != before
        fresh = MelCache()
        fresh.update(front_end, state.mel_buffer, 0)
        cache = state.mel_cache
        assert cache.frames == fresh.frames == state.mel_buffer.shape[0] // 160
        assert torch.equal(cache.log[:, : cache.frames], fresh.log[:, : fresh.frames])
        assert torch.equal(cache.peaks[: cache.frames], fresh.peaks[: fresh.frames])
        assert mel.shape == (80, 102 if state.units == 0 else 104)
        state.units += 1
    assert slid == 2 and state.buffer_base_frame == 20 * CORE_FRAMES  # 10 s dropped at 30 s, twice


def test_blockwise_log_mel_matches_the_whole_buffer_one_within_float_rounding():
    """The blockwise definition differs from one STFT + one matrix product over the whole buffer only by how
    the BLAS sums (the frames themselves are the same): well inside float32 noise of log-mel values."""
    front_end = MelFrontEnd(80)
    buffer = np.concatenate(_session_units(12))
    cache = MelCache()
    cache.update(front_end, buffer, 0)
    whole = front_end.frame_log_mel(np.pad(buffer, PAD, mode="reflect"))[:, :-1]
    assert whole.shape == (80, cache.frames)
    # measured here (log values -5.1..1.5): 0 with MKL_CBWR unset, COMPATIBLE or AVX512, 2.4e-7 with AVX2
    torch.testing.assert_close(cache.log[:, : cache.frames], whole, rtol=0, atol=1e-5)
    scaled_whole = (torch.maximum(whole, whole.max() - 8.0) + 4.0) / 4.0
    torch.testing.assert_close(cache.scaled(0, cache.frames, True), scaled_whole, rtol=0, atol=1e-5)
