"""What an untrusted audio file declares, read from its container header before a sample is decoded.

``probe`` opens the container (PyAV reads the header and, for some formats, up to ``PROBE_BYTES`` of packets to
fill in stream parameters) and refuses, from what the header declares alone, a file whose decoded audio would be
too large: sample rate, channels, duration and decoded samples each have a cap. A 700 kB FLAC declaring
655,350 Hz for 290 s (190 M samples, gigabytes once decoded and resampled) is refused from its STREAMINFO; a WAV
whose fmt chunk names no decodable codec (bits 0, format tag 0xFFFF) is a typed refusal, not an AttributeError.

The probe also says what the file is: a stored upload is named with ``MediaHeader.extension``, taken from the
content, never from the name the client sent (``clip.WAV;.html`` holding a WAV is stored as ``.wav``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from inference.contracts import ParleyError

MAX_RATE = 192_000  # studio rates; anything above is not a recording of a voice
MAX_CHANNELS = 8  # 7.1; the clip is downmixed to mono anyway
MAX_DECODED_SAMPLES = 30_000_000  # per channel: 5 minutes at 96 kHz, 120 MB as float32 mono
PROBE_BYTES = 2 * 1024 * 1024  # what FFmpeg may read past the header to find the streams' parameters

# Container signatures: a file starting with one of these is meant to be audio/video, so failing to open it
# means a damaged file rather than something that is not audio at all.
_MEDIA_MAGIC = (b"RIFF", b"fLaC", b"OggS", b"ID3", b"\x1aE\xdf\xa3", b"\xff\xfb", b"\xff\xf3", b"\xff\xf2")

# FFmpeg's demuxer name -> the extension a stored copy gets. Anything else FFmpeg opens is stored as ``.bin``:
# a name no web server renders as a page.
_EXTENSIONS = {
    "wav": ".wav",
    "flac": ".flac",
    "ogg": ".ogg",
    "matroska,webm": ".webm",
    "mp3": ".mp3",
    "mov,mp4,m4a,3gp,3g2,mj2": ".m4a",
    "aiff": ".aiff",
    "aac": ".aac",
    "caf": ".caf",
}


class VoiceClipError(ParleyError):
    """A clip that cannot become a voice. ``code`` is one of: ``empty``, ``too_big``, ``not_audio``,
    ``corrupted``, ``unsupported_codec``, ``too_demanding`` (its header declares, or its decoding needed, more
    than the caps), ``truncated``, ``no_audio_track``, ``too_long``, ``too_short``, ``silent``, ``clipped``,
    ``bad_prompt`` (a ``.pt`` / ``.safetensors`` prompt file that is not the expected tensors)."""

    error_type = "invalid_request_error"


@dataclass(frozen=True)
class MediaHeader:
    """What the container declares about its first audio stream.

    Attributes:
        format_name: FFmpeg's demuxer name (``wav``, ``flac``, ``matroska,webm``, ...).
        codec: the audio codec's name.
        rate: declared sample rate (Hz).
        channels: declared channel count.
        declared_s: declared duration, or None when the container has none (MediaRecorder webm).
        extension: what a stored copy of the file is named with (from the content).
    """

    format_name: str
    codec: str
    rate: int
    channels: int
    declared_s: float | None
    extension: str


def open_media(data: bytes):
    """The PyAV container of ``data`` (the caller closes it).

    Raises:
        VoiceClipError: ``not_audio`` or ``corrupted``.
    """
    import av

    looks_like_media = data.startswith(_MEDIA_MAGIC) or data[4:8] == b"ftyp"
    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore", options={"probesize": str(PROBE_BYTES)})
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        if looks_like_media:
            raise VoiceClipError(f"The file's header is damaged and cannot be read ({exc}).", code="corrupted") from exc
        raise VoiceClipError("This is not an audio file (no known audio format recognised).", code="not_audio") from exc


def read_header(container, *, max_seconds: float) -> MediaHeader:
    """The first audio stream's declared parameters, each checked against its cap; nothing is decoded.

    Raises:
        VoiceClipError: ``no_audio_track``, ``unsupported_codec``, ``too_long`` or ``too_demanding``.
    """
    if not container.streams.audio:
        if container.streams.video:
            raise VoiceClipError("The video has no audio track.", code="no_audio_track")
        raise VoiceClipError("The file has no audio stream.", code="no_audio_track")
    stream = container.streams.audio[0]
    context = stream.codec_context
    if context is None:  # e.g. a WAV fmt chunk with 0 bits per sample or format tag 0xFFFF
        raise VoiceClipError(
            "The audio stream's format header names no codec that can decode it (unknown format tag or a damaged "
            "fmt chunk, such as 0 bits per sample).",
            code="unsupported_codec",
        )
    rate, channels = int(context.sample_rate or 0), int(context.channels or 0)
    if not 0 < rate <= MAX_RATE:
        raise VoiceClipError(
            f"The clip declares a sample rate of {rate} Hz; at most {MAX_RATE} Hz are accepted.", code="too_demanding"
        )
    if not 0 < channels <= MAX_CHANNELS:
        raise VoiceClipError(
            f"The clip declares {channels} audio channels; 1 to {MAX_CHANNELS} are accepted.", code="too_demanding"
        )
    declared_s = _declared_seconds(container, stream)
    if declared_s is not None and declared_s > max_seconds:
        raise VoiceClipError(
            f"The clip is {declared_s:.0f} s long; at most {max_seconds:.0f} s ({max_seconds / 60:g} minutes) are "
            "accepted.",
            code="too_long",
        )
    if declared_s is not None and declared_s * rate > MAX_DECODED_SAMPLES:
        raise VoiceClipError(
            f"The clip declares {declared_s:.0f} s at {rate} Hz ({declared_s * rate / 1e6:.0f} M samples); at most "
            f"{MAX_DECODED_SAMPLES / 1e6:.0f} M samples ({MAX_DECODED_SAMPLES / rate:.0f} s at this rate) are "
            "accepted.",
            code="too_demanding",
        )
    return MediaHeader(
        format_name=container.format.name,
        codec=context.name,
        rate=rate,
        channels=channels,
        declared_s=declared_s,
        extension=_EXTENSIONS.get(container.format.name, ".bin"),
    )


def probe(data: bytes, *, max_seconds: float) -> MediaHeader:
    """Open ``data``, check what its header declares, close it. Cheap: no sample is decoded.

    Raises:
        VoiceClipError: ``empty``, ``not_audio``, ``corrupted`` or any refusal of ``read_header``.
    """
    if not data:
        raise VoiceClipError("The file is empty.", code="empty")
    with open_media(data) as container:
        return read_header(container, max_seconds=max_seconds)


def _declared_seconds(container, stream) -> float | None:
    """The duration the container's header declares, if any."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None
