"""Camera frames and audio units: decoding, sizes, and typed errors for malformed input."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from inference.models.minicpmo.audio_encoder import AudioStreamState
from inference.models.minicpmo.vision import FrameError, best_frame_size, decode_frame


def _encode(frame: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("size", "expected"), [((448, 448), (448, 448)), ((640, 480), (518, 392)), ((1280, 720), (602, 336))]
)
def test_frames_keep_their_aspect_ratio_in_whole_patches(size, expected):
    assert best_frame_size(*size, 448, 14) == expected


def test_webcam_jpeg_becomes_64_embeddings(minicpmo_parts):
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    decoded = decode_frame(_encode(frame, "JPEG"), 448)
    assert decoded.shape == (392, 518, 3)
    embeds = minicpmo_parts.vision.embed_frame(decoded)
    assert embeds.shape == (64, 128) and bool(embeds.isfinite().all())


def test_png_448_frame_is_lossless(minicpmo_parts, minicpmo_data_dir):
    frame = np.load(minicpmo_data_dir / "omni6" / "frames.npy")[0]
    assert np.array_equal(decode_frame(_encode(frame, "PNG"), 448), frame)


def test_bad_frames_raise_frame_error(minicpmo_parts):
    with pytest.raises(FrameError, match="decodable"):
        decode_frame(b"\xff\xd8\xff not really a jpeg", 448)
    with pytest.raises(FrameError, match="uint8"):
        minicpmo_parts.vision.embed_frame(np.zeros((448, 448, 3), np.float32))
    with pytest.raises(FrameError, match="multiples of 14"):
        minicpmo_parts.vision.embed_frame(np.zeros((440, 448, 3), np.uint8))


def test_audio_units_must_be_one_second(minicpmo_parts):
    state = AudioStreamState()
    with pytest.raises(ValueError, match="16000"):
        minicpmo_parts.audio.embed_unit(state, np.zeros(15999, np.float32))
    with pytest.raises(ValueError, match="at least 400"):
        minicpmo_parts.audio.embed_reference(np.zeros(100, np.float32))
    assert state.units == 0 and state.kv is None  # a rejected unit leaves the stream untouched
