"""Where the tiny PersonaPlex pack lives and the greedy decoding the fast-path tests compare with."""

from __future__ import annotations

from pathlib import Path

from inference.models.moshi.gen import SamplingConfig

DATA = Path(__file__).resolve().parents[3] / "data" / "personaplex"
GREEDY = SamplingConfig(use_sampling=False)
