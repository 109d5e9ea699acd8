"""The unit's vocoder stage on its own: the native Token2Wav per 1 s unit, for bench/unit_gpu.py (issue 12).

Random assets in the published layout, at the published flow / HiFT shapes and tiny, 5 and 10 flow steps; each
unit timed with the device synchronised. ``bench/unit_gpu.py --vocoder-only`` runs only this section.

``batched_section``: N speaking sessions' units session by session (``synthesize`` each, as the engine did) beside
the same units of twin sessions in one ``synthesize_many`` call (as the engine does now), side by side in one run;
``bench/unit_gpu.py --vocoder-batched`` runs it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from bench.stats import summary
from bench.unit_workload import make_audio, sync


def stats(values: list[float]) -> dict:
    return summary(values, suffix="_ms", digits=1, median=True)


def vocoder_units(units: int, published_sizes: bool, n_timesteps: int, device: str) -> dict:
    """The native Token2Wav per 1 s unit (25 codes, as one speaking unit yields), device synchronised.

    Random assets in the published layout (``make_token2wav_assets``): at the published flow / HiFT shapes or
    tiny. The first 5 units (first-seen shapes, allocator warm-up) are left out of the statistics.
    """
    import tempfile

    from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets
    from inference.models.minicpmo.vocoder import Token2WavVocoder

    with tempfile.TemporaryDirectory() as tmp:
        assets = make_token2wav_assets(Path(tmp) / "t2w", published_sizes=published_sizes)
        vocoder = Token2WavVocoder(assets, device=device, n_timesteps=n_timesteps)
        sync()
        t0 = time.perf_counter()
        state = vocoder.new_state(make_audio(2, 5))
        sync()
        prompt_ms = (time.perf_counter() - t0) * 1000
        rng = np.random.default_rng(0)
        per_unit, rms = [], []
        for u in range(units + 5):
            if u % 20 == 0:
                vocoder.new_turn(state)  # a turn of 20 s at most: the stream caches stay a real turn's size
            codes = rng.integers(0, 6561, 25).tolist()
            sync()
            t0 = time.perf_counter()
            audio = vocoder.synthesize(state, codes, end_of_turn=False)
            sync()
            if u >= 5:
                per_unit.append((time.perf_counter() - t0) * 1000)
                rms.append(float(np.sqrt(np.mean(np.square(audio)))))
    return {
        "assets": "random, published flow/HiFT shapes" if published_sizes else "random, tiny",
        "flow_steps": n_timesteps,
        "prompt_ms": round(prompt_ms, 1),
        "unit": stats(per_unit),
        "audio_rms_min": round(min(rms), 4),
    }


def vocoder_section(units: int, device: str) -> dict:
    rows = {}
    for published in (True, False):
        for steps in (5, 10):
            row = vocoder_units(units, published, steps, device)
            rows[f"{'published' if published else 'tiny'}_steps{steps}"] = row
            print("token2wav", json.dumps(row), flush=True)
    return {"bench": "native Token2Wav per 1 s unit (25 codes), float32", "rows": rows}


BATCH_VOICES = 4  # distinct voice clips, all 2 s: one prompt length, so their sessions can share batches
TURN_UNITS = 20  # a turn of 20 units, the sessions' turns out of phase (first / second / later chunks side by side)
WARMUP_UNITS = 5  # left out of the statistics: first-seen shapes, allocator warm-up


def batched_section(sizes: list[int], units: int, published_sizes: bool, device: str, n_timesteps: int = 5) -> dict:
    """Per session vs batched, for each number of speaking sessions in ``sizes``, on one loaded vocoder."""
    import tempfile

    from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets
    from inference.models.minicpmo.vocoder import Token2WavVocoder

    with tempfile.TemporaryDirectory() as tmp:
        assets = make_token2wav_assets(Path(tmp) / "t2w", published_sizes=published_sizes)
        vocoder = Token2WavVocoder(assets, device=device, n_timesteps=n_timesteps)
        voices = [vocoder.new_state(make_audio(2, seed)) for seed in range(BATCH_VOICES)]
        rows = []
        for n in sizes:
            row = batched_row(vocoder, voices, n, units)
            print("token2wav batched", json.dumps(row), flush=True)
            rows.append(row)
    return {
        "bench": f"native Token2Wav, N speaking sessions per 1 s unit (25 codes each), float32: {units} units "
        "session by session (synthesize each) vs the same units of twin sessions in one synthesize_many call",
        "assets": "random, published flow/HiFT shapes" if published_sizes else "random, tiny",
        "flow_steps": n_timesteps,
        "workload": f"{BATCH_VOICES} voices of 2 s; turns of {TURN_UNITS} units, out of phase across sessions; "
        f"first {WARMUP_UNITS} units left out; device synchronised around each timed call",
        "rows": rows,
    }


def batched_row(vocoder, voices: list, n: int, units: int) -> dict:
    """One N: each unit timed session by session, then the same codes through twin sessions in one call.

    The first ``TURN_UNITS`` units are not measured: they bring the sessions' turns out of phase (run batched on
    both twins, which keeps them alike) and, in their last ``WARMUP_UNITS``, see every shape both ways.
    """
    alone, together = _twin_sessions(vocoder, voices, n), _twin_sessions(vocoder, voices, n)
    rng = np.random.default_rng(n)
    per_session, batched, batches, diff = [], [], [], 0.0
    for u in range(TURN_UNITS + units):
        for i in range(n):
            if (u + i * TURN_UNITS // n) % TURN_UNITS == 0:
                vocoder.new_turn(alone[i])
                vocoder.new_turn(together[i])
        codes = [rng.integers(0, 6561, 25).tolist() for _ in range(n)]
        if u < TURN_UNITS - WARMUP_UNITS:
            vocoder.synthesize_many(alone, codes, [False] * n)
            vocoder.synthesize_many(together, codes, [False] * n)
            continue
        groups = len({_chunk_key(s) for s in together})  # 25 codes on a buffer of 3: one chunk per session
        sync()
        t0 = time.perf_counter()
        want = [vocoder.synthesize(s, c, end_of_turn=False) for s, c in zip(alone, codes, strict=True)]
        sync()
        t1 = time.perf_counter()
        got = vocoder.synthesize_many(together, codes, [False] * n)
        sync()
        t2 = time.perf_counter()
        if u >= TURN_UNITS:
            per_session.append((t1 - t0) * 1000)
            batched.append((t2 - t1) * 1000)
            batches.append(groups)
            diff = max(diff, max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True)))
    one, many = stats(per_session), stats(batched)
    return {
        "sessions": n,
        "per_session": one,
        "batched": many,
        "speedup_median": round(one["median_ms"] / many["median_ms"], 2),
        "speedup_p99": round(one["p99_ms"] / many["p99_ms"], 2),
        "batches_per_unit_mean": round(float(np.mean(batches)), 2),
        "max_abs_diff_audio": float(f"{diff:.3g}"),
    }


def _twin_sessions(vocoder, voices: list, n: int) -> list:
    """N sessions on the voices in turn, each from its voice's prompt caches (forked: the prompt is set up once)."""
    from inference.models.minicpmo.vocoder import VocoderState

    states = [VocoderState(base_caches=(voices[i % len(voices)].base_caches[0].fork(),)) for i in range(n)]
    for state in states:
        vocoder.new_turn(state)
    return states


def _chunk_key(state) -> tuple:
    """The batch key of the session's next chunk (28 codes, not the last)."""
    from inference.models.minicpmo.token2wav.stream import batch_key

    return batch_key(state.caches[0], [0] * 28, False)
