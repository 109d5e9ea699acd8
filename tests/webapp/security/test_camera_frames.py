"""Finding 6 (camera frames): a frame's size is checked from its header, before a pixel is decoded."""

import io

import pytest
from PIL import Image, ImageFile

from inference.models.minicpmo.vision import MAX_FRAME_PIXELS, FrameError, decode_frame


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def decodes(monkeypatch) -> list[tuple[int, int]]:
    """The sizes of the images whose pixels were decoded (ImageFile.load is where PIL decodes)."""
    seen: list[tuple[int, int]] = []
    real_load = ImageFile.ImageFile.load

    def load(self):
        seen.append(self.size)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return seen


def test_a_small_png_declaring_a_huge_bitmap_is_refused_without_decoding_it(decodes):
    bomb = png(6000, 6000)  # 36 M pixels (108 MB as RGB) in a file of a few kB
    assert len(bomb) < 50_000 and 6000 * 6000 > MAX_FRAME_PIXELS
    with pytest.raises(FrameError, match="6000x6000"):
        decode_frame(bomb, 448)
    assert decodes == []


def test_a_webcam_frame_still_decodes(decodes):
    frame = decode_frame(png(640, 480), 448)
    assert frame.shape == (392, 518, 3) and decodes == [(640, 480)]
