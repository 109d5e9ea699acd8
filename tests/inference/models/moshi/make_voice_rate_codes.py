"""Make ``tests/data/personaplex/voice_rates/``: the voice wav at 16, 44.1 and 48 kHz (mono, 16-bit PCM) and the
PersonaPlex reference's Mimi codes of each, as its ``load_voice_prompt`` prepares them, on the tiny checkpoint.

Needs ``.venv-personaplex-ref`` (``scripts/install-personaplex-ref.sh`` with ``PARLEY_PERSONAPLEX_SRC``):

    .venv/bin/python -m tests.inference.models.moshi.make_voice_rate_codes
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile
import soxr

from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA
from tests.inference.models.moshi.personaplex_packs import VOICE_WAV, reference_available, run_reference_job
from tests.inference.models.moshi.test_voice_prep_parity import RATES, STORED_CODES, VOICE_RATES


def main() -> None:
    if not reference_available():
        sys.exit(".venv-personaplex-ref is missing: run scripts/install-personaplex-ref.sh with PARLEY_PERSONAPLEX_SRC")
    VOICE_RATES.mkdir(parents=True, exist_ok=True)
    speech, rate = soundfile.read(str(VOICE_WAV), dtype="float32")  # 24 kHz speech, about 1 s
    for dst in RATES:
        mono = soxr.resample(speech, rate, dst).astype(np.float32)
        soundfile.write(VOICE_RATES / f"mono{dst}.wav", mono, dst, subtype="PCM_16")
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [{"voice": str(VOICE_RATES / f"mono{dst}.wav"), "out": str(Path(tmp) / f"mono{dst}.npy")} for dst in RATES]
        run_reference_job(PERSONAPLEX_DATA / "ckpt", [], Path(tmp), voice_codes=jobs)
        np.savez(STORED_CODES, **{f"mono{dst}": np.load(job["out"]) for dst, job in zip(RATES, jobs, strict=True)})
    print(f"wrote {VOICE_RATES}")


if __name__ == "__main__":
    main()
