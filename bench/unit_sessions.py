"""How the unit GPU benches drive sessions: one tick of several sessions, and one session's units timed stage by
stage (device synchronised), shared by ``unit_gpu.py``, ``unit_equality.py`` and ``unit_host_threads.py``."""

from __future__ import annotations

import time

import numpy as np

from bench.unit_workload import make_audio, speaks, sync


def jobs_of(runner, sessions, audios, frames, unit: int) -> list:
    jobs = []
    for k, s in enumerate(sessions):
        embeds = None if frames is None else runner.parts.vision.embed_frame(frames)
        jobs.append((s, audios[k][unit * 16000 : (unit + 1) * 16000], embeds))
    return jobs


def tick(runner, sessions, audios, frames, unit: int, indices: list[int]) -> list:
    """One tick for ``sessions``: prefill each, decide all together; returns the results."""
    runner.prefill_many(jobs_of(runner, sessions, audios, frames, unit))
    return runner.generate_many([(s, not speaks(indices[k], unit)) for k, s in enumerate(sessions)])


def timed(fn, *args):
    sync()
    t0 = time.perf_counter()
    out = fn(*args)
    sync()
    return out, (time.perf_counter() - t0) * 1000


class StageTimer:
    """Wraps one method of a model part on the instance (``obj.name``), summing its calls' time into ``ms``; the
    model's code is untouched. ``synced``: the device is synchronised around each call (a device stage's time,
    not its launch); the host mel is timed without, as it runs."""

    def __init__(self, obj, name: str, *, synced: bool) -> None:
        self.inner, self.synced, self.ms = getattr(obj, name), synced, 0.0
        setattr(obj, name, self)

    def __call__(self, *args, **kwargs):
        if self.synced:
            sync()
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        if self.synced:
            sync()
        self.ms += (time.perf_counter() - t0) * 1000
        return out


def stage_timer(obj, name: str, *, synced: bool) -> StageTimer:
    """The timer on ``obj.name``, installed on first use (once per model part, for every runner on it), zeroed."""
    timer = getattr(obj, name)
    if not isinstance(timer, StageTimer):
        timer = StageTimer(obj, name, synced=synced)
    timer.ms = 0.0
    return timer


def one_session(runner, audio_units: int, omni_units: int, seed: int) -> dict:
    """Prepare + audio units + omni units (one 448x448 frame each), each unit timed (device synchronised) as
    prefill (the previous unit's close, this unit's mel, encoder, frame and LLM run) + generate (decisions, TTS
    codes); every unit's record is kept (``units``) for the tail's evidence."""
    ref = make_audio(2, seed + 1)
    audio = make_audio(audio_units + omni_units, seed)
    frame = np.random.default_rng(seed).integers(0, 256, (448, 448, 3), dtype=np.uint8)
    session = runner.new_session()
    _, prepare_ms = timed(runner.prepare, session, "Streaming Omni Conversation.", ref)
    units = []
    for u in range(audio_units + omni_units):
        omni = u >= audio_units
        kv = runner.parts.llm.cache_length(session.llm_cache)
        mel = stage_timer(runner.parts.audio, "unit_mel", synced=False)
        # the TTS codes of the unit (the batched decode on the fast runner, per session on the eager one)
        fast_tts = getattr(runner, "fast_tts", None)
        tts = stage_timer(fast_tts, "generate_units", synced=True) if fast_tts else None
        tts = tts or stage_timer(runner.parts.tts, "generate_unit", synced=True)
        _, prefill_ms = timed(runner.prefill_many, jobs_of(runner, [session], [audio], frame if omni else None, u))
        (result,), generate_ms = timed(runner.generate_many, [(session, not speaks(0, u))])
        kind = ("omni_" if omni else "") + ("listen" if result.is_listen else "speak")
        units.append({
            "unit": u, "kind": kind, "unit_ms": round(prefill_ms + generate_ms, 2), "prefill_ms": round(prefill_ms, 2),
            "mel_ms": round(mel.ms, 2), "generate_ms": round(generate_ms, 2), "tts_ms": round(tts.ms, 2), "kv_len": kv,
            "n_ids": len(result.llm_ids), "ids": list(result.llm_ids),
        })  # fmt: skip
    runner.finalize(session)
    del session
    return {"prepare_ms": round(prepare_ms, 1), "units": units}
