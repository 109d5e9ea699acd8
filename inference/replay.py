"""Run a recorded call's caller track again on another configuration, into a recording of its own.

The source is a call's steps file (``inference.recording.steps_file``): each step's caller audio exactly as the
engine got it (silence where none arrived) and the frames it saw. The replay opens one slot of an engine built
from the configuration asked for (the source's own by default: same engine, checkpoint, slots, dtype, greedy),
prepares it as the live worker does (prefill steps without input until the slot is live), then feeds the
steps one by one, either at the call's own pace (each step at its original time) or as fast as the engine
goes. Every step is written by the service's recorder format, so the web tier post-processes the result like
any call. With greedy decoding and the source's configuration the engine is deterministic: the replay's agent
tokens equal the call's.

The engine is built and run here, in the calling process (the Celery worker, or the web process when Celery is
eager), as computing a voice prompt is; one replay runs at a time per process, and the last engine is kept
for the next replay with the same configuration.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from inference.audio.pcm import encode_pcm16
from inference.config import ConfigError, InferenceConfig
from inference.contracts import ParleyError, VoiceRef
from inference.engines import build_engine
from inference.engines.base import Engine, EngineError, SlotConfig, SlotInput
from inference.errors import EngineNotAvailable
from inference.recording.recorder import Recorder, record_steps
from inference.recording.steps_file import CallSteps

Pace = Literal["original", "fast"]
MAX_PREFILL_STEPS = 100_000  # a prefill that never ends is an engine fault, not a wait
_lock = threading.Lock()  # one replay at a time in a process: the engine is single-threaded
_kept: dict[str, Any] = {}  # the last engine built, under its configuration's key


@dataclass(frozen=True)
class ReplaySettings:
    """What differs from the source call (None: the source's own)."""

    engine: str | None = None
    checkpoint: str | None = None
    persona: str | None = None
    voice: VoiceRef | None = None
    greedy: bool | None = None
    pace: Pace = "fast"


@dataclass(frozen=True)
class ReplayOutcome:
    session_id: str
    steps: int
    seconds: float  # wall time of the steps (prefill excluded)
    engine: str
    checkpoint: str | None


def replay_config(source_meta: dict[str, Any], settings: ReplaySettings, base: InferenceConfig) -> InferenceConfig:
    """The configuration a replay runs on: the source call's, with the settings' changes."""
    values: dict[str, Any] = {}
    for name in ("slots", "device", "dtype", "greedy", "lockstep_backend"):
        if source_meta.get(name) is not None:
            values[name] = source_meta[name]
    engine = settings.engine or source_meta.get("engine") or base.engine
    checkpoint = settings.checkpoint or source_meta.get("checkpoint")
    values["engine"] = engine
    values["checkpoint"] = Path(checkpoint) if checkpoint else None
    if settings.greedy is not None:
        values["greedy"] = settings.greedy
    try:
        return base.with_overrides(**values)
    except (ConfigError, TypeError, ValueError) as exc:
        raise ParleyError(f"cannot replay on this configuration: {exc}", code="invalid_value") from exc


def run_replay(
    calls: CallSteps,
    frames: dict[int, bytes],
    *,
    session_id: str,
    settings: ReplaySettings,
    base: InferenceConfig,
    recordings_dir: Path,
    progress: Callable[[float], None] | None = None,
) -> ReplayOutcome:
    """Replay ``calls`` (with the camera ``frames`` by step) into the raw recording ``session_id``."""
    config = replay_config(calls.meta, settings, base)
    persona = settings.persona if settings.persona is not None else calls.meta.get("persona")
    with _lock:
        engine = _engine_for(config)
        caps = engine.capabilities
        if caps.input_chunk_samples != int(calls.meta.get("input_chunk_samples", -1)) or caps.input_rate != int(
            calls.meta.get("input_rate", -1)
        ):
            raise ParleyError(
                f"engine {caps.engine!r} takes {caps.input_chunk_samples} samples at {caps.input_rate} Hz a step; the"
                f" call was recorded at {calls.meta.get('input_chunk_samples')} at {calls.meta.get('input_rate')} Hz",
                code="invalid_value",
                param="engine",
            )
        recorder = Recorder(recordings_dir)
        recorder.start()
        try:
            return _run(engine, calls, frames, session_id, settings, config, persona, recorder, progress)
        finally:
            recorder.stop()


def _run(engine, calls, frames, session_id, settings, config, persona, recorder, progress) -> ReplayOutcome:
    caps = engine.capabilities
    meta = {
        "engine": caps.engine,
        "family": caps.family,
        "checkpoint": str(config.checkpoint) if config.checkpoint else None,
        "input_rate": caps.input_rate,
        "input_chunk_samples": caps.input_chunk_samples,
        "output_rate": caps.output_rate,
        "chunk_period_ms": caps.chunk_period_ms,
        "slots": config.slots,
        "device": config.device,
        "dtype": config.dtype,
        "greedy": config.greedy,
        "lockstep_backend": config.lockstep_backend,
        "persona": persona,
        "voice": settings.voice.voice_id if settings.voice else calls.meta.get("voice"),
        "replay_of": calls.meta.get("session_id"),
        "pace": settings.pace,
    }
    recording = recorder.begin(session_id, meta, video=bool(frames))
    silence = np.zeros(caps.input_chunk_samples, np.float32)
    engine.open_slot(0, SlotConfig(persona=persona, voice=settings.voice))
    try:
        _prefill(engine)
        started = time.monotonic()
        origin = calls.times[0] if calls.times else 0.0
        for step in range(calls.steps):
            if settings.pace == "original":  # the caller's timing kept: each step at its time in the call
                wait = started + (calls.times[step] - origin) - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            pcm = calls.caller.get(step)
            audio = silence if pcm is None else np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
            tick = time.perf_counter()
            out = engine.step({0: SlotInput(audio=audio, image=frames.get(step))})[0]
            step_ms = (time.perf_counter() - tick) * 1000.0
            pcm16 = encode_pcm16(out.audio) if out.audio.size else b""
            _wait_for_writer(recorder)
            record_steps([recording.step_item(None if pcm is None else audio, pcm16, out, step_ms, frames.get(step))])
            if progress is not None and (step % 25 == 0 or step == calls.steps - 1):
                progress((step + 1) / calls.steps)
        seconds = time.monotonic() - started
    except EngineError as exc:
        recording.finish("engine_failed")
        raise ParleyError(f"the replay failed: {exc}", code="engine_failed", error_type="server_error") from exc
    finally:
        engine.close_slot(0)
    recording.finish("client_close")
    return ReplayOutcome(session_id, calls.steps, seconds, caps.engine, meta["checkpoint"])


def _wait_for_writer(recorder: Recorder) -> None:
    """A fast replay outruns the writer thread; the recorder drops what a full queue cannot take (a live call
    must never wait), but a replay can: it waits instead, so no step is lost."""
    while recorder.pending >= recorder.max_pending // 2:
        time.sleep(0.002)


def _prefill(engine: Engine) -> None:
    """Step without input until the slot is live, as the live worker does before it feeds a slot."""
    if engine.live_at_open(0):
        return
    for _ in range(MAX_PREFILL_STEPS):
        out = engine.step({}).get(0)
        if out is None or not out.prefilling:
            return
    raise EngineError("the slot's prefill never ended")


def _engine_for(config: InferenceConfig) -> Engine:
    key = repr(dataclasses.replace(config, inference_token=None))
    engine = _kept.get(key)
    if engine is None:
        _kept.clear()  # one model at a time: the previous one's memory goes back first
        try:
            engine = build_engine(config)
            engine.warmup()
        except (EngineNotAvailable, EngineError) as exc:
            raise ParleyError(f"cannot start the engine to replay on: {exc}", code="engine_failed") from exc
        _kept[key] = engine
    return engine
