"""Finding 6 (camera frames): a frame's size is checked from its header, before a pixel is decoded:
at the session's edge (the caller gets invalid_image) and where the engine decodes."""

import base64
import dataclasses
import io
import struct
import zlib

import pytest
from PIL import Image, ImageFile

from inference.engines.echo import EchoEngine
from inference.image_header import MAX_FRAME_PIXELS, oversized
from inference.models.minicpmo.vision import FrameError, decode_frame
from tests.webapp.realtime.realtime_helpers import make_account, ready_peer


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG that is only its signature, IHDR and IEND: the size it declares is all there is."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(
        b"IEND", b""
    )


def test_a_header_past_pils_own_bomb_limit_is_refused_not_waved_through():
    """PIL's open raises DecompressionBombError past 2 * MAX_IMAGE_PIXELS (~179 M) instead of giving a size;
    that must read as too large, not as "header unreadable, let the decoder decide"."""
    assert "30000x30000" not in (oversized(png_header(30000, 30000)) or "")
    assert "more than 178956970 pixels" in oversized(png_header(30000, 30000))  # 900 M pixels
    with pytest.warns(Image.DecompressionBombWarning):  # 160 M: PIL only warns, and the size is read
        assert "20000x8000" in oversized(png_header(20000, 8000))
    assert oversized(png_header(640, 480)) is None


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


class VideoEcho(EchoEngine):
    """The echo engine declaring video input (it ignores the frames), to reach the session's image checks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.capabilities = dataclasses.replace(self.capabilities, video=True)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("bomb", "said"),
    [(png(6000, 6000), "6000x6000"), (png_header(20000, 20000), "more than 178956970 pixels")],
    ids=["36M-pixels", "400M-pixels-past-pils-limit"],
)
async def test_the_caller_hears_of_an_oversized_frame_at_once_and_the_call_goes_on(inference_service, bomb, said):
    await inference_service(engine_instance=VideoEcho(2))
    peer, _ = await ready_peer(await make_account("alice"))
    await peer.prime()
    await peer.send({"type": "input_image.append", "image": base64.b64encode(bomb).decode(), "event_id": "img-big"})
    error = await peer.error()
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_image", "image", "img-big")
    assert said in error["message"]
    await peer.send({"type": "input_image.append", "image": base64.b64encode(png(640, 480)).decode()})
    await peer.proves_alive()
    errors = [e["error"]["event_id"] for e in peer.seen if isinstance(e, dict) and e["type"] == "error"]
    assert errors == ["img-big"]  # the webcam-sized frame was taken
    await peer.close()
