"""Camera frames' declared size, read from the JPEG/PNG header without decoding a pixel.

PIL's ``Image.open`` reads only the header, so a small, highly compressed file claiming a huge
bitmap is refused before anything allocates it: at the session's edge (the caller gets
``invalid_image`` at once) and again where the engine decodes (``models.minicpmo.vision``).
"""

from __future__ import annotations

import io

# Imported with the session module, not on the first frame: those imports would stall the event loop.
from PIL import Image, JpegImagePlugin, PngImagePlugin, UnidentifiedImageError

_FORMATS = (PngImagePlugin.PngImageFile.format, JpegImagePlugin.JpegImageFile.format)  # the two a frame may have
Image.preinit()  # PIL's own lazy imports of its common plugins, done now rather than on the first frame

# Far above any camera (4K is 8.3 M pixels); a decoded RGB frame stays under 50 MB.
MAX_FRAME_PIXELS = 4096 * 4096


def declared_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the image header, or None when the header cannot be read."""
    try:
        # Only those two: trying every plugin PIL has on a broken file takes ~0.4 s (and all its imports).
        with Image.open(io.BytesIO(data), formats=_FORMATS) as img:
            return img.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None


def oversized(data: bytes) -> str | None:
    """Why the frame is too large to decode, or None (also for an unreadable header: the decoder says so)."""
    size = declared_size(data)
    if size is not None and size[0] * size[1] > MAX_FRAME_PIXELS:
        return f"image of {size[0]}x{size[1]} pixels; frames may have at most {MAX_FRAME_PIXELS} pixels"
    return None
