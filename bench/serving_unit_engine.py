"""The unit engine ``bench/serving_gpu_service.py --engine unit`` serves: MiniCPM-o 4.5 with random weights, built
as ``bench/unit_gpu.py`` builds it, behind the real ``UnitEngine`` (the fast runner on CUDA, graphs captured).

- on CUDA: the real 4.5 shapes (9.35 B parameters) in bf16, made on the GPU (nothing on disk but the config and,
  with ``vocoder="token2wav"``, random Token2Wav assets at the published flow / HiFT shapes);
- ``tiny``: the repository's tiny random checkpoint (``make-minicpmo-checkpoint``) in float32 on the CPU, to try
  the plumbing on a small machine.

A random LLM speaks on every unit it is free to decide, so the units speak as the capacity bench's do
(``bench/unit_workload.speaks``: about 40 % of units, staggered over the slots; the others are sent with
``force_listen``), and the engine's tick here is comparable with ``bench/results/unit-capacity-*.json``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import torch

from bench.unit_workload import DATA, REAL_45, speaks
from inference.engines.base import SlotConfig, SlotInput, SlotOutput
from inference.engines.unit import UnitEngine
from inference.models.minicpmo.fast.runner import DEFAULT_CAPACITY
from inference.models.minicpmo.vocoder import ASSET_SUBDIR


class SpeakingRuleUnitEngine(UnitEngine):
    """``UnitEngine`` whose slots speak on the capacity bench's units only: unit ``u`` of slot ``s`` is sent with
    ``force_listen`` unless ``speaks(s, u)``. Units are counted per slot from its first unit after the prepare."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.units_done: dict[int, int] = {}

    def open_slot(self, slot: int, config: SlotConfig) -> None:
        super().open_slot(slot, config)
        self.units_done[slot] = 0

    def step(self, inputs: Mapping[int, SlotInput]) -> dict[int, SlotOutput]:
        ruled = {}
        for slot, unit in inputs.items():
            if self.session_of(slot) is None:  # prepared this tick: the input is not part of the call
                ruled[slot] = unit
                continue
            u = self.units_done.get(slot, 0)
            self.units_done[slot] = u + 1
            ruled[slot] = unit if speaks(slot, u) else dataclasses.replace(unit, force_listen=True)
        return super().step(ruled)


def build_unit_engine(
    slots: int, tmp: Path, *, tiny: bool, vocoder: str, context: int = DEFAULT_CAPACITY
) -> SpeakingRuleUnitEngine:
    """The warmed engine; ``tmp`` holds its checkpoint directory (config, and the vocoder's assets if any);
    ``context``: its LLM positions per call (``PARLEY_UNIT_CONTEXT`` through the service's config)."""
    from bench.unit_gpu import build_model, keep_speaking
    from inference.models.minicpmo.loading import load_model
    from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets

    ckpt = tmp / "unit-ckpt"
    if tiny:
        from inference.models.minicpmo.fill import make_checkpoint

        make_checkpoint(ckpt, data_dir=DATA)
        device, dtype = "cpu", "float32"
        parts = load_model(ckpt, device=device, dtype=torch.float32)
        keep_speaking(parts)
    else:
        ckpt.mkdir(parents=True)
        (ckpt / "config.json").write_text(json.dumps(REAL_45))
        device, dtype = "cuda", "bfloat16"
        parts = build_model(torch.bfloat16, REAL_45, device)  # keep_speaking applied, before the fast runner
    if vocoder == "token2wav":
        make_token2wav_assets(ckpt / ASSET_SUBDIR, published_sizes=not tiny)
    engine = SpeakingRuleUnitEngine(ckpt, slots, device=device, dtype=dtype, context=context)
    engine.warmup(loaded=parts)
    return engine
