"""A video call's frames with its recording: the frames the engine saw, at their times, and an MP4 of the call.

Post-processing adds to the rendered files (``render.Rendered``), from the decoded raw recording:

- ``frames.bin``: the camera frames, as the engine got them (JPEG/PNG bytes), one after another;
- ``frames.json``: for each frame its step, its time on the audio's clock, its offset and size in ``frames.bin``
  (the review page shows frame ``i`` from ``t[i]`` to ``t[i + 1]``);
- ``call.mp4``: H.264 video (each frame from its time until the next one's) with AAC stereo (caller left, agent
  right), made with PyAV;
- ``steps.prc``: what the engine got step by step (``inference.api.recording_steps_file``), for replays.

All of it is stored like the audio, so it counts in ``stored_bytes`` and goes with the recording (retention,
deletion).
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import replace
from fractions import Fraction
from typing import Any

import av
import numpy as np

from inference import api
from webapp.recordings.render import Rendered, stereo_tracks

logger = logging.getLogger(__name__)

MS = Fraction(1, 1000)
MAX_SIDE = 1280  # frames are scaled down to fit (an MP4 of a 4K camera is not what a reviewer needs)


def frame_index(raw) -> tuple[list[dict[str, Any]], bytes]:
    """The frames' index (step, t, offset, size) and their bytes, in time order."""
    index, parts, offset = [], [], 0
    for step, data in raw.frames:
        index.append({"step": step, "t": round(raw.step_time(step), 4), "offset": offset, "size": len(data)})
        parts.append(data)
        offset += len(data)
    return index, b"".join(parts)


def with_video(raw, rendered: Rendered) -> Rendered:
    """``rendered`` with the steps file and, for a call whose frames were kept, the frames and the MP4."""
    files = dict(rendered.files)
    files["steps"] = ("steps.prc", api.recording_steps_file(raw))
    if raw.frames:
        index, blob = frame_index(raw)
        files["frames"] = ("frames.bin", blob)
        files["frames_index"] = ("frames.json", json.dumps({"frames": index}, separators=(",", ":")).encode())
        try:
            files["mp4"] = ("call.mp4", call_mp4(raw, index, blob, rendered.duration_s))
        except (av.FFmpegError, ValueError) as exc:  # the frames stay reviewable without the MP4
            logger.warning("recordings.mp4_failed", extra={"session_id": raw.session_id, "reason": str(exc)})
    return replace(rendered, files=files)


def call_mp4(raw, index: list[dict[str, Any]], blob: bytes, duration_s: float) -> bytes:
    """The call as an MP4: the frames at their times (held until the next), both audio channels."""
    images = [_decode_image(blob[f["offset"] : f["offset"] + f["size"]]) for f in index]
    kept = [(f["t"], image) for f, image in zip(index, images, strict=True) if image is not None]
    if not kept:
        raise ValueError("no frame could be decoded")
    width, height = _size(kept[0][1])
    stereo, rate = stereo_tracks(raw)
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=1000)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.time_base = video.codec_context.time_base = MS
        video.options = {"preset": "veryfast", "crf": "23"}
        audio = container.add_stream("aac", rate=rate, layout="stereo")
        last_pts = -1
        for t, image in kept:
            pts = max(round(t * 1000), last_pts + 1)
            last_pts = _encode_image(container, video, image, width, height, pts)
        end_pts = round(duration_s * 1000)
        if end_pts > last_pts:  # the last frame stays up to the end of the call
            _encode_image(container, video, kept[-1][1], width, height, end_pts)
        container.mux(video.encode(None))
        _encode_audio(container, audio, stereo, rate)
    return out.getvalue()


def _decode_image(data: bytes):
    try:
        with av.open(io.BytesIO(data)) as image:
            return next(image.decode(video=0))
    except (av.FFmpegError, StopIteration, ValueError):
        return None  # a damaged frame is left out (the engine skipped it as well)


def _size(frame) -> tuple[int, int]:
    scale = min(1.0, MAX_SIDE / max(frame.width, frame.height))
    even = lambda v: max(2, int(v * scale) // 2 * 2)  # noqa: E731 - yuv420p needs even sides
    return even(frame.width), even(frame.height)


def _encode_image(container, stream, image, width: int, height: int, pts: int) -> int:
    # Through RGB: a camera's JPEG is full-range YUV; reformatting it straight to yuv420p would squeeze its levels.
    rgb = av.VideoFrame.from_ndarray(image.to_ndarray(format="rgb24"), format="rgb24")
    frame = rgb.reformat(width=width, height=height, format="yuv420p")
    frame.pts, frame.time_base = pts, MS
    container.mux(stream.encode(frame))
    return pts


def _encode_audio(container, stream, stereo: np.ndarray, rate: int) -> None:
    samples = np.ascontiguousarray(stereo.astype(np.int16))  # [n, 2], caller left, agent right
    block = 1024 * 8
    for start in range(0, len(samples), block):
        chunk = samples[start : start + block]
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
        container.mux(stream.encode(frame))
    container.mux(stream.encode(None))
