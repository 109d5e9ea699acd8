"""What the engine got and gave, step by step: the file a replay runs from, kept with a processed recording.

The raw chunks are deleted once a call is post-processed; the stereo audio laid on the wall clock cannot give
back the exact frame each step fed the engine (ticks that ran late, gaps). This file keeps, in the raw
format's checksummed records (``inference.recording.chunks``), what a replay needs: the call's configuration
(one ``meta`` event first), each step's tick time, the caller's pcm16 for each step that had audio, and the
agent's tokens when the engine reported them. Camera frames are kept apart (the review page shows them too).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.recording.chunks import STEP, TICK, ChunkError, Kind, encode_event, encode_record, read_stream
from inference.recording.reader import RawRecording


class StepsFileError(Exception):
    """The bytes are not a steps file (or are damaged): nothing can be replayed from them."""


@dataclass
class CallSteps:
    """A call, step by step: ``caller[k]`` is step k's pcm16 (absent: the engine was fed silence)."""

    meta: dict[str, Any]
    times: list[float] = field(default_factory=list)  # step k's start on the call's clock (s)
    caller: dict[int, bytes] = field(default_factory=dict)
    agent_tokens: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.times)


def encode_steps(raw: RawRecording) -> bytes:
    """The steps file of a decoded raw recording."""
    parts = [encode_event({"k": "meta", "t": 0.0, **raw.meta})]
    for step in range(raw.steps):
        parts.append(encode_record(Kind.TICK, TICK.pack(step, raw.step_time(step), 0.0)))
        if step in raw.caller_steps:
            parts.append(encode_record(Kind.CALLER_AUDIO, STEP.pack(step) + raw.caller_steps[step]))
        if step in raw.agent_tokens:
            tokens = np.asarray(raw.agent_tokens[step], dtype="<i4").tobytes()
            parts.append(encode_record(Kind.TOKENS, STEP.pack(step) + tokens))
    return b"".join(parts)


def decode_steps(data: bytes) -> CallSteps:
    """Read a steps file back; raises ``StepsFileError`` naming what is wrong."""
    calls: CallSteps | None = None
    try:
        for record in read_stream(io.BytesIO(data), "steps"):
            if record.kind == Kind.EVENT:
                event = json.loads(record.payload)
                if calls is None and isinstance(event, dict) and event.get("k") == "meta":
                    calls = CallSteps(meta={k: v for k, v in event.items() if k not in ("k", "t")})
                continue
            if calls is None:
                raise StepsFileError("the steps file does not start with the call's configuration")
            if record.kind == Kind.TICK:
                step, seconds, _ = TICK.unpack(record.payload)
                if step != len(calls.times):
                    raise StepsFileError(f"step {step} is out of order")
                calls.times.append(seconds)
            elif record.kind == Kind.CALLER_AUDIO:
                calls.caller[STEP.unpack_from(record.payload)[0]] = record.payload[STEP.size :]
            elif record.kind == Kind.TOKENS:
                body = record.payload[STEP.size :]
                tokens = np.frombuffer(body[: len(body) // 4 * 4], dtype="<i4")
                calls.agent_tokens[STEP.unpack_from(record.payload)[0]] = tuple(int(t) for t in tokens)
    except ChunkError as exc:
        raise StepsFileError(f"damaged steps file: {exc}") from exc
    except ValueError as exc:  # JSON or struct errors
        raise StepsFileError(f"damaged steps file: {exc}") from exc
    if calls is None or not calls.times:
        raise StepsFileError("the steps file holds no steps")
    return calls
