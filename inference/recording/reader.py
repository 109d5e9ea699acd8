"""Read a raw recording folder back into two aligned tracks, its events and its tick timings.

Used by post-processing (through ``inference.api.read_recording``). Damage never raises past
this module except as ``RawRecordingError`` (nothing usable at all): a bad chunk is reported by
name in ``problems`` and the rest of the call is still read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inference.recording.chunks import (
    END_FILE,
    META_FILE,
    STEP,
    TICK,
    ChunkError,
    Kind,
    chunk_files,
    read_json,
    read_records,
)
from inference.recording.wall_clock import Timeline, lay_out


class RawRecordingError(Exception):
    """Nothing playable can be made of the folder (no meta.json, no audio at all)."""


@dataclass
class RawRecording:
    """A decoded recording. Audio is int16 mono on the call's wall clock (``inference.recording.wall_clock``):
    step ``k`` starts at ``step_starts[k]`` seconds, and ``gaps`` name the silences laid in between."""

    session_id: str
    meta: dict[str, Any]
    end: dict[str, Any] | None  # None: the session is still running (or its service has not restarted)
    caller: np.ndarray
    caller_rate: int
    agent: np.ndarray
    agent_rate: int
    period_ms: int
    ticks: list[tuple[int, float, float]] = field(default_factory=list)  # (step, seconds, tick ms)
    events: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # damaged chunks, dropped items: each names its cause
    chunks: list[str] = field(default_factory=list)
    step_starts: list[float] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)  # {"t", "end", "cause"}: marked silence
    # What the engine got and gave, step by step (format 3), for video and replays: the caller's pcm16 per step
    # (absent: no audio arrived, the engine was fed silence), the camera frames it saw, the agent's tokens.
    caller_steps: dict[int, bytes] = field(default_factory=dict)
    frames: list[tuple[int, bytes]] = field(default_factory=list)  # (step, JPEG/PNG bytes), in step order
    agent_tokens: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return self.ticks[-1][0] + 1 if self.ticks else 0

    @property
    def duration_s(self) -> float:
        return max(len(self.caller) / self.caller_rate, len(self.agent) / self.agent_rate)

    def step_time(self, step: int) -> float:
        """Where step ``step`` starts on the recording's clock (past the last step: one period each)."""
        if step < len(self.step_starts):
            return self.step_starts[step]
        last = len(self.step_starts) - 1
        base = self.step_starts[last] if last >= 0 else 0.0
        return base + (step - last) * self.period_ms / 1000.0

    @property
    def interrupted(self) -> bool:
        return bool(self.end and self.end.get("interrupted"))

    @property
    def finished(self) -> bool:
        return self.end is not None


def read_recording(folder: Path) -> RawRecording:
    """Decode every chunk of ``folder``; raises ``RawRecordingError`` when nothing is usable."""
    meta = read_json(folder / META_FILE)
    if meta is None:
        raise RawRecordingError(f"{META_FILE} is missing or unreadable in {folder.name}")
    try:
        caller_rate, agent_rate = int(meta["input_rate"]), int(meta["output_rate"])
        period_ms, chunk_samples = int(meta["chunk_period_ms"]), int(meta["input_chunk_samples"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RawRecordingError(f"{META_FILE} lacks a valid {exc}") from exc
    end = read_json(folder / END_FILE)
    caller_parts: list[tuple[int, bytes]] = []
    agent_parts: list[tuple[int, bytes]] = []
    recording = RawRecording(
        session_id=str(meta.get("session_id", folder.name)),
        meta=meta,
        end=end,
        caller=np.zeros(0, np.int16),
        caller_rate=caller_rate,
        agent=np.zeros(0, np.int16),
        agent_rate=agent_rate,
        period_ms=period_ms,
    )
    files = chunk_files(folder)
    for index, path in enumerate(files):
        recording.chunks.append(path.name)
        try:
            for record in read_records(path):
                _take(record.kind, record.payload, recording, caller_parts, agent_parts)
        except ChunkError as exc:
            # A kill mid-write cuts the last record of the last chunk: expected, not damage.
            killed_tail = exc.truncated and index == len(files) - 1 and (end is None or recording.interrupted)
            if not killed_tail:
                recording.problems.append(str(exc))
        except OSError as exc:
            recording.problems.append(f"{path.name}: unreadable ({exc.strerror or exc})")
    if not recording.ticks:
        raise RawRecordingError(
            "no audio was recorded" + (f" ({'; '.join(recording.problems)})" if recording.problems else "")
        )
    if end is not None and end.get("problem"):
        recording.problems.append(str(end["problem"]))
    # Format 2 writes no caller record for a step whose caller audio did not arrive: those are gaps.
    caller_steps = {step for step, _ in caller_parts} if int(meta.get("format", 1)) >= 2 else None
    end_s = end.get("duration_s") if end is not None else None
    timeline = lay_out(
        recording.ticks,
        period_s=period_ms / 1000.0,
        events=recording.events,
        caller_steps=caller_steps,
        end_s=float(end_s) if isinstance(end_s, int | float) else None,
    )
    recording.step_starts, recording.gaps = timeline.starts, timeline.gaps
    recording.caller_steps = dict(caller_parts)
    recording.frames.sort(key=lambda item: item[0])
    recording.caller = _place(caller_parts, timeline, caller_rate, chunk_samples, sequential=False)
    recording.agent = _place(agent_parts, timeline, agent_rate, round(agent_rate * period_ms / 1000), sequential=True)
    return recording


def _take(kind: int, payload: bytes, recording: RawRecording, caller: list, agent: list) -> None:
    if kind == Kind.TICK:
        recording.ticks.append(TICK.unpack(payload))
    elif kind == Kind.CALLER_AUDIO:
        caller.append((STEP.unpack_from(payload)[0], payload[STEP.size :]))
    elif kind == Kind.AGENT_AUDIO:
        agent.append((STEP.unpack_from(payload)[0], payload[STEP.size :]))
    elif kind == Kind.FRAME:
        recording.frames.append((STEP.unpack_from(payload)[0], payload[STEP.size :]))
    elif kind == Kind.TOKENS:
        body = payload[STEP.size :]
        tokens = np.frombuffer(body[: len(body) // 4 * 4], dtype="<i4")
        recording.agent_tokens[STEP.unpack_from(payload)[0]] = tuple(int(t) for t in tokens)
    elif kind == Kind.EVENT:
        try:
            event = json.loads(payload)
        except ValueError:
            event = None
        if isinstance(event, dict):  # a checksummed record that is not JSON was written by another format
            recording.events.append(event)


def _place(
    parts: list[tuple[int, bytes]], timeline: Timeline, rate: int, step_samples: int, *, sequential: bool
) -> np.ndarray:
    """Lay each step's samples at its step's start on the timeline; steps lost to drops or damage, and the
    timeline's gaps, stay silent. The track is as long as the timeline (a silent tail included).

    ``sequential``: a step may carry more (or less) than one step of audio (a unit engine's unit);
    such audio is laid after the previous step's, never over it, as the caller's player would.
    """
    total = round(timeline.duration_s * rate)
    if not parts:
        return np.zeros(total if total > 0 else 0, np.int16)
    samples = [np.frombuffer(data[: len(data) // 2 * 2], dtype="<i2") for _, data in parts]
    end = 0
    starts = []
    for (step, _), chunk in zip(parts, samples, strict=True):
        start = round(timeline.starts[step] * rate) if step < len(timeline.starts) else step * step_samples
        if sequential:
            start = max(start, end)
        starts.append(start)
        end = max(end, start + len(chunk))
    out = np.zeros(max(end, total), np.int16)
    for start, chunk in zip(starts, samples, strict=True):
        out[start : start + len(chunk)] = chunk
    return out
