"""Turn a decoded raw recording into the files the review page uses. Pure: no Django, no storage.

- ``stereo.wav`` / ``stereo.ogg`` (Opus): caller left, agent right, at the agent's rate.
- ``peaks.json``: per-track peak levels, ``PEAKS_PER_S`` a second, for the waveforms.
- ``transcript.json``: the model's text in lines with start/end times (seconds on the audio's clock).
- ``timeline.json``: tick timings, heard-vs-generated (playback acks), barge-ins, pauses, detaches,
  listen/speak decisions, each at its time on the audio's clock.

Times: the audio is on the call's wall clock (``inference.recording.wall_clock``): engine step ``k``
starts at ``raw.step_time(k)``; time without steps (ticks running late, a pause, a detach) and steps
without caller audio are silence, each span a ``gap`` marker with its cause, and a pause or a detach
also keeps its own marker (with its wall-clock length).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

PEAKS_PER_S = 50
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
LINE_GAP_S = 1.2  # text deltas further apart than this start a new transcript line
LINE_MAX_CHARS = 160
SENTENCE_END = (".", "?", "!")


class RawRecording(Protocol):
    """What ``inference.api.read_recording`` returns (``inference.recording.reader.RawRecording``)."""

    session_id: str
    meta: dict[str, Any]
    end: dict[str, Any] | None
    caller: np.ndarray
    caller_rate: int
    agent: np.ndarray
    agent_rate: int
    period_ms: int
    ticks: list[tuple[int, float, float]]
    events: list[dict[str, Any]]
    problems: list[str]
    gaps: list[dict[str, Any]]

    def step_time(self, step: int) -> float: ...


@dataclass(frozen=True)
class Rendered:
    files: dict[str, tuple[str, bytes]]  # kind -> (file name, content)
    duration_s: float
    transcript_text: str


def render(raw: RawRecording, progress: Callable[[float], None] = lambda _: None) -> Rendered:
    """Every output file of ``raw``; ``progress`` gets fractions in [0, 1] as the work goes on."""
    stereo, rate = stereo_tracks(raw)
    duration_s = len(stereo) / rate
    progress(0.2)
    wav = io.BytesIO()
    sf.write(wav, stereo, rate, format="WAV", subtype="PCM_16")
    progress(0.4)
    ogg = io.BytesIO()
    sf.write(ogg, stereo.astype(np.float32) / 32768.0, _opus_rate(rate), format="OGG", subtype="OPUS")
    progress(0.7)
    lines = transcript_lines(raw)
    peaks = {
        "per_s": PEAKS_PER_S,
        "duration_s": duration_s,
        "caller": peak_levels(stereo[:, 0], rate),
        "agent": peak_levels(stereo[:, 1], rate),
    }
    timeline = timeline_of(raw, duration_s)
    progress(0.85)
    files = {
        "ogg": ("stereo.ogg", ogg.getvalue()),
        "wav": ("stereo.wav", wav.getvalue()),
        "peaks": ("peaks.json", _json(peaks)),
        "transcript": ("transcript.json", _json({"lines": lines})),
        "timeline": ("timeline.json", _json(timeline)),
    }
    return Rendered(files, duration_s, "\n".join(line["text"] for line in lines))


def stereo_tracks(raw: RawRecording) -> tuple[np.ndarray, int]:
    """int16 [n, 2]: the caller (resampled to the agent's rate if they differ) left, the agent right."""
    rate = raw.agent_rate
    caller = raw.caller
    if raw.caller_rate != rate and caller.size:
        g = np.gcd(raw.caller_rate, rate)
        resampled = resample_poly(caller.astype(np.float32), rate // g, raw.caller_rate // g)
        caller = np.clip(np.round(resampled), -32768, 32767).astype(np.int16)
    n = max(len(caller), len(raw.agent))
    stereo = np.zeros((n, 2), np.int16)
    stereo[: len(caller), 0] = caller
    stereo[: len(raw.agent), 1] = raw.agent
    return stereo, rate


def _opus_rate(rate: int) -> int:
    if rate not in OPUS_RATES:
        raise ValueError(f"Opus cannot store {rate} Hz audio")  # every engine here runs at 16 or 24 kHz
    return rate


def peak_levels(track: np.ndarray, rate: int) -> list[float]:
    """The largest |sample| in each 1/PEAKS_PER_S s bucket, in [0, 1], rounded for a small file."""
    bucket = max(1, rate // PEAKS_PER_S)
    n = -(-len(track) // bucket)
    padded = np.zeros(n * bucket, np.int32)
    padded[: len(track)] = np.abs(track.astype(np.int32))
    return [round(v, 3) for v in (padded.reshape(n, bucket).max(axis=1) / 32768.0).tolist()]


def step_time(raw: RawRecording, step: int) -> float:
    return round(raw.step_time(step), 3)


def transcript_lines(raw: RawRecording) -> list[dict[str, Any]]:
    """The model's text deltas joined into lines, each with the time span of its deltas."""
    lines: list[dict[str, Any]] = []
    epoch = 0
    for event in raw.events:
        if event.get("k") == "epoch":
            epoch = int(event.get("epoch", epoch + 1))
            continue
        if event.get("k") == "message":  # a chat message: a line of its own, naming who wrote it
            start = step_time(raw, int(event.get("step", 0)))
            lines.append({"start": start, "end": start, "text": _message_text(event), "epoch": epoch,
                          "speaker": str(event.get("role", "user"))})  # fmt: skip
            continue
        if event.get("k") != "text" or not isinstance(event.get("text"), str):
            continue
        start = step_time(raw, int(event.get("step", 0)))
        end = start + raw.period_ms / 1000.0
        current = lines[-1] if lines else None
        new_line = (
            current is None
            or current["epoch"] != epoch
            or "speaker" in current
            or start - current["end"] > LINE_GAP_S
            or len(current["text"]) >= LINE_MAX_CHARS
            or current["text"].rstrip().endswith(SENTENCE_END)
        )
        if new_line:
            lines.append({"start": start, "end": round(end, 3), "text": event["text"].lstrip(), "epoch": epoch})
        else:
            current["text"] += event["text"]
            current["end"] = round(end, 3)
    for line in lines:
        line["text"] = line["text"].strip()
    return [line for line in lines if line["text"]]


def _message_text(event: dict[str, Any]) -> str:
    """A chat message's text, saying what was attached (the recording never holds an image's bytes)."""
    attached = [name for name, on in (("image", event.get("image")), ("audio", event.get("audio_s"))) if on]
    note = f"[{' and '.join(attached)} attached]" if attached else ""
    return f"{str(event.get('text') or '').strip()} {note}".strip()


def timeline_of(raw: RawRecording, duration_s: float) -> dict[str, Any]:
    """Ticks, heard-vs-generated, and the call's events, on the audio's clock."""
    markers: list[dict[str, Any]] = []
    heard: list[dict[str, float]] = []
    open_gap: dict[str, dict[str, Any]] = {}
    for event in raw.events:
        kind = event.get("k")
        at = step_time(raw, int(event.get("step", 0)))
        wall = float(event.get("t", 0.0))
        if kind == "ack":
            heard.append(
                {"t": at, "played_ms": float(event.get("played_ms", 0)), "sent_ms": float(event.get("sent_ms", 0))}
            )
        elif kind in ("pause", "detach"):
            open_gap[kind] = {"kind": kind, "t": at, "wall_t": wall}
        elif kind in ("resume", "attach") and (gap := open_gap.pop("pause" if kind == "resume" else "detach", None)):
            markers.append({**gap, "wall_s": round(wall - gap["wall_t"], 2)})
        elif kind == "message":  # chat: the timeline is the concatenation of the recorded audio
            markers.append({"kind": "message", "t": at, "role": event.get("role"), "text": _message_text(event)})
        elif kind == "epoch" and event.get("response"):  # a new response (half-duplex, chat), not a barge-in
            markers.append({"kind": "response", "t": at, "epoch": event.get("epoch")})
        elif kind == "epoch":
            markers.append(
                {"kind": "barge_in", "t": at, "epoch": event.get("epoch"), "unplayed_ms": event.get("unplayed_ms")}
            )
        elif kind == "decision":
            markers.append({"kind": event.get("kind", "decision"), "t": at, "end_of_turn": bool(event.get("eot"))})
    for gap in open_gap.values():  # paused or detached when the call ended
        markers.append({**gap, "wall_s": None})
    for gap in raw.gaps:  # marked silence: time the call had that the engine's steps did not fill
        markers.append({"kind": "gap", "t": gap["t"], "end": gap["end"], "cause": gap["cause"],
                        "silence_s": round(gap["end"] - gap["t"], 3)})  # fmt: skip
    ticks = [[step_time(raw, step), round(ms, 3)] for step, _, ms in raw.ticks]
    tick_ms = np.array([ms for _, ms in ticks] or [0.0])
    return {
        "duration_s": round(duration_s, 3),
        "period_ms": raw.period_ms,
        "ticks": ticks,
        "tick_ms_p50": round(float(np.percentile(tick_ms, 50)), 3),
        "tick_ms_p99": round(float(np.percentile(tick_ms, 99)), 3),
        "heard": heard,
        "markers": sorted(markers, key=lambda m: m["t"]),
        "problems": list(raw.problems),
        "end": raw.end or {},
    }


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
