"""Camera frames' declared size, read from the JPEG/PNG header without decoding a pixel.

PIL's ``Image.open`` reads only the header, so a small, highly compressed file claiming a huge
bitmap is refused before anything allocates it: at the session's edge (the caller gets
``invalid_image`` at once) and again where the engine decodes (``models.minicpmo.vision``).
A header past PIL's own bomb limit (``2 * Image.MAX_IMAGE_PIXELS``, ~179 M pixels) makes ``open``
raise instead of returning a size: that is a refusal too, never "size unknown".
"""

from __future__ import annotations

import io

# Imported with the session module, not on the first frame: those imports would stall the event loop.
from PIL import Image, JpegImagePlugin, PngImagePlugin, UnidentifiedImageError

_FORMATS = (PngImagePlugin.PngImageFile.format, JpegImagePlugin.JpegImageFile.format)  # the two a frame may have
Image.preinit()  # PIL's own lazy imports of its common plugins, done now rather than on the first frame

_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")  # JPEG, PNG

# Far above any camera (4K is 8.3 M pixels); a decoded RGB frame stays under 50 MB.
MAX_FRAME_PIXELS = 4096 * 4096


class HeaderTooLarge(Exception):
    """The header declares more pixels than PIL will even open (its decompression-bomb limit)."""


def declared_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the image header, or None when the header cannot be read.

    Raises:
        HeaderTooLarge: the header declares more than PIL's bomb limit; the size itself is not returned.
    """
    try:
        # Only those two: trying every plugin PIL has on a broken file takes ~0.4 s (and all its imports).
        with Image.open(io.BytesIO(data), formats=_FORMATS) as img:
            return img.size
    except Image.DecompressionBombError as exc:
        raise HeaderTooLarge(str(exc)) from exc
    except (UnidentifiedImageError, OSError, ValueError):
        return None


def oversized(data: bytes) -> str | None:
    """Why the frame is too large to decode, or None (also for an unreadable header: the decoder says so)."""
    try:
        size = declared_size(data)
    except HeaderTooLarge:
        limit = 2 * Image.MAX_IMAGE_PIXELS
        return f"image declaring more than {limit} pixels; frames may have at most {MAX_FRAME_PIXELS} pixels"
    if size is not None and size[0] * size[1] > MAX_FRAME_PIXELS:
        return f"image of {size[0]}x{size[1]} pixels; frames may have at most {MAX_FRAME_PIXELS} pixels"
    return None


def refusal(data: bytes) -> str | None:
    """Why a camera frame or chat image is refused from its first bytes and header alone, or None."""
    if not data.startswith(_MAGIC):
        return "images must be JPEG or PNG"
    return oversized(data)
