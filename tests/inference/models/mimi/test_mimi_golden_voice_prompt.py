"""Golden: the PersonaPlex pack's voice_prompt.wav, levelled to -24 LUFS and encoded frame by frame, gives
exactly the reference's `voice_prompt_codes.npy` (int64 [8, 28]). Also the loudness meter on its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from inference.audio.loudness import LoudnessError, integrated_loudness, normalize_loudness

DATA = Path(__file__).resolve().parents[4] / "tests" / "data" / "personaplex"
FRAME = 1920


def test_voice_prompt_encodes_frame_by_frame_to_the_golden_codes(golden_codec):
    pcm, rate = sf.read(DATA / "voice_prompt.wav", dtype="float32")
    assert rate == golden_codec.sample_rate
    levelled = normalize_loudness(pcm, rate, -24.0)
    frames = -(-levelled.shape[0] // FRAME)  # the last frame zero-padded, as the reference does
    padded = np.zeros(frames * FRAME, dtype=np.float32)
    padded[: levelled.shape[0]] = levelled
    state = golden_codec.init_stream(1)
    codes = [golden_codec.encode_step(torch.from_numpy(padded[i * FRAME : (i + 1) * FRAME])[None, None], state)
             for i in range(frames)]  # fmt: skip
    codes = torch.cat(codes, dim=-1)[0].numpy()
    golden = np.load(DATA / "voice_prompt_codes.npy")
    assert golden.shape == (8, 28) and codes.shape == golden.shape
    np.testing.assert_array_equal(codes, golden)


def test_without_levelling_the_codes_differ(golden_codec):
    # The loudness step matters: the raw wav (about -19.5 LUFS) encodes differently.
    pcm, _ = sf.read(DATA / "voice_prompt.wav", dtype="float32")
    padded = np.zeros(28 * FRAME, dtype=np.float32)
    padded[: pcm.shape[0]] = pcm
    codes = golden_codec.encode(torch.from_numpy(padded)[None, None])[0].numpy()
    assert not np.array_equal(codes, np.load(DATA / "voice_prompt_codes.npy"))


def sine(freq: float, amplitude: float, seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float64)


def test_full_scale_997_hz_sine_reads_minus_3_lufs():
    # BS.1770-4, 2.1: a 0 dBFS 997 Hz sine in one channel reads -3.01 LKFS. The cookbook biquads (kept for
    # parity with pyloudnorm, hence with the reference's gains) read about 0.04 dB low at 997 Hz.
    assert integrated_loudness(sine(997.0, 1.0, 5.0, 48000), 48000) == pytest.approx(-3.01, abs=0.06)


def test_level_follows_gain_and_normalisation_hits_the_target():
    rng = np.random.default_rng(3)
    noise = (rng.standard_normal(24000 * 3) * 0.05).astype(np.float32)
    level = integrated_loudness(noise, 24000)
    assert integrated_loudness(noise * 0.5, 24000) == pytest.approx(level - 6.0206, abs=1e-3)
    levelled = normalize_loudness(noise, 24000, -24.0)
    assert levelled.dtype == np.float32
    assert integrated_loudness(levelled, 24000) == pytest.approx(-24.0, abs=1e-3)


def test_relative_gate_ignores_quiet_passages():
    # 2 s of tone then 6 s at -54 dB: an ungated mean would read 6 dB below the tone; the gates drop the quiet
    # blocks, and only the three blocks straddling the edge (3/4, 1/2, 1/4 tone) pull the level down 0.34 dB.
    tone = sine(1000.0, 0.5, 2.0, 48000)
    quiet = sine(1000.0, 0.001, 6.0, 48000)
    mixed = integrated_loudness(np.concatenate([tone, quiet]), 48000)
    expected = integrated_loudness(tone, 48000) + 10 * np.log10((17 + 0.75 + 0.5 + 0.25) / 20)
    assert mixed == pytest.approx(expected, abs=0.01)


def test_silence_is_returned_unchanged():
    silence = np.zeros(24000, dtype=np.float32)
    assert integrated_loudness(silence, 24000) == -np.inf
    np.testing.assert_array_equal(normalize_loudness(silence, 24000, -24.0), silence)


@pytest.mark.parametrize(
    ("audio", "rate", "match"),
    [
        (np.zeros(100, dtype=np.float32), 24000, "at least"),
        (np.zeros(24000, dtype=np.int16), 24000, "floating point"),
        (np.full(24000, np.nan, dtype=np.float32), 24000, "NaN"),
        (np.zeros((6, 24000), dtype=np.float32), 24000, "channels"),
        ([0.0] * 24000, 24000, "numpy array"),
        (np.zeros(24000, dtype=np.float32), 0, "sample_rate"),
    ],
)
def test_bad_audio_gets_a_loudness_error(audio, rate, match):
    with pytest.raises(LoudnessError, match=match):
        integrated_loudness(audio, rate)


def test_bad_target_gets_a_loudness_error():
    with pytest.raises(LoudnessError, match="target_lufs"):
        normalize_loudness(np.zeros(24000, dtype=np.float32), 24000, float("nan"))
