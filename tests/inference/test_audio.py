"""Audio plumbing: streaming resampling and PCM validation (framing: test_framing.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import resample_poly

from inference.audio.pcm import check_format, decode, encode_pcm16
from inference.audio.resample import StreamingResampler
from inference.contracts import ParleyError
from inference.session.input_audio import InputAudio


@pytest.mark.parametrize("src,dst", [(48_000, 24_000), (16_000, 24_000), (44_100, 24_000), (24_000, 16_000)])
def test_streaming_resampler_matches_one_shot_and_keeps_a_sine(src, dst):
    t = np.arange(src) / src
    signal = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    one_shot = StreamingResampler(src, dst).process(signal)
    streaming = StreamingResampler(src, dst)
    rng = np.random.default_rng(0)
    parts, pos = [], 0
    while pos < len(signal):
        size = int(rng.integers(1, 2500))
        parts.append(streaming.process(signal[pos : pos + size]))
        pos += size
    chunked = np.concatenate(parts)
    np.testing.assert_allclose(chunked, one_shot, atol=1e-6)
    # Output n sits at input time n / dst: compare with the ideal sine away from the start-up edge.
    expected = np.sin(2 * np.pi * 440 * np.arange(len(one_shot)) / dst)
    assert np.abs(one_shot[64:] - expected[64:]).max() < 1e-3
    assert dst - 100 < len(one_shot) <= dst  # only the look-ahead is held back
    # Same answer as scipy's offline polyphase resampler, in the settled middle.
    reference = resample_poly(signal, dst, src)[: len(one_shot)]
    mid = slice(len(one_shot) // 4, 3 * len(one_shot) // 4)
    assert np.abs(one_shot[mid] - reference[mid]).max() < 1e-3


def test_resampler_removes_content_above_the_new_nyquist():
    src, dst = 48_000, 16_000
    t = np.arange(src) / src
    tone = np.sin(2 * np.pi * 15_000 * t).astype(np.float32)  # above 8 kHz: must not alias into the band
    out = StreamingResampler(src, dst).process(tone)
    assert np.sqrt(np.mean(out[200:] ** 2)) < 0.01


def test_identity_resampler_passes_samples_through():
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    np.testing.assert_array_equal(StreamingResampler(24_000, 24_000).process(x), x)


def test_pcm16_round_trip_is_exact():
    values = np.array([-32768, -12345, -1, 0, 1, 12345, 32767], dtype="<i2")
    assert encode_pcm16(decode(values.tobytes(), "pcm16")) == values.tobytes()


def test_f32_decode_clips_and_keeps_values():
    data = np.array([0.5, -0.25, 1.5, -2.0], dtype="<f4").tobytes()
    assert decode(data, "f32").tolist() == [0.5, -0.25, 1.0, -1.0]


@pytest.mark.parametrize(
    "data,encoding",
    [(b"\x00\x01\x02", "pcm16"), (b"\x00" * 6, "f32"), (np.array([0.1, np.nan], "<f4").tobytes(), "f32")],
)
def test_bad_audio_is_invalid_audio(data, encoding):
    with pytest.raises(ParleyError) as info:
        decode(data, encoding)
    assert info.value.code == "invalid_audio"


def test_inf_is_invalid_audio():
    with pytest.raises(ParleyError, match="NaN or Inf"):
        decode(np.array([np.inf], "<f4").tobytes(), "f32")


@pytest.mark.parametrize("encoding,rate", [("opus", 24_000), ("pcm16", 100), ("pcm16", 10**6), ("f32", 24_000.5)])
def test_unsupported_formats(encoding, rate):
    with pytest.raises(ParleyError) as info:
        check_format(encoding, rate)
    assert info.value.code == "unsupported_audio_format"


def test_resampled_input_stays_in_full_scale():
    """A resampling filter rings past full scale at a square wave's edges; the session's input is clipped to
    [-1, 1] after it, since the stages behind it (the echo watch's int16 ring) rely on that range."""
    square = np.where(np.arange(48_000) % 96 < 48, 32767, -32768).astype("<i2")
    assert np.abs(StreamingResampler(48_000, 24_000).process(decode(square.tobytes(), "pcm16"))).max() > 1.0
    samples = InputAudio(24_000).samples(square.tobytes(), "pcm16", 48_000)
    assert samples.size > 20_000 and samples.min() == -1.0 and samples.max() == 1.0
