"""The unit's vocoder stage on its own: the native Token2Wav per 1 s unit, for bench/unit_gpu.py (issue 12).

Random assets in the published layout, at the published flow / HiFT shapes and tiny, 5 and 10 flow steps; each
unit timed with the device synchronised. ``bench/unit_gpu.py --vocoder-only`` runs only this section.
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
