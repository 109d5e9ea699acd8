"""Per-slot KV rings of the temporal transformer, in the model dtype or in fp8 (e4m3) with per-vector scales.

One ring per (layer, slot, head) of ``W = config.kv_window`` positions (the checkpoint's ``context``, one fewer
for PersonaPlex: see ``LMConfig.kv_window``); a slot's frame at position p lives at ``p % W``.
Slot ``num_slots`` is a scratch slot: padding rows of a batch bucket point there, so their writes never touch
a live session. Nothing needs clearing on reset: a row only ever reads the first ``min(pos + 1, W)``
entries of its ring, and each of those was written by the same session before it is read.

Memory per slot: ``layers x 2 x heads x W x head_dim`` bytes in fp8 (0.79 GB for the 7B at 3000 frames,
half of bf16) plus ``layers x 2 x heads x W`` fp32 scales (25 MB).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.models.moshi.config import LMConfig
from inference.models.moshi.fast.ops import FP8_DTYPE


@dataclass
class SlotKV:
    """KV rings for ``num_slots`` sessions (+1 scratch slot).

    Attributes:
        keys, values: per layer [num_slots + 1, heads, context, head_dim].
        key_scales, value_scales: per layer [num_slots + 1, heads, context] fp32, only for fp8 rings.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_scales: list[torch.Tensor] | None
    value_scales: list[torch.Tensor] | None

    @classmethod
    def allocate(cls, config: LMConfig, num_slots: int, device, dtype: torch.dtype, fp8: bool = False) -> SlotKV:
        shape = (num_slots + 1, config.num_heads, config.kv_window, config.dim // config.num_heads)
        ring_dtype = FP8_DTYPE if fp8 else dtype
        n = config.num_layers
        keys = [torch.zeros(shape, device=device, dtype=ring_dtype) for _ in range(n)]
        values = [torch.zeros(shape, device=device, dtype=ring_dtype) for _ in range(n)]
        scales = None
        vscales = None
        if fp8:
            scales = [torch.ones(shape[:3], device=device, dtype=torch.float32) for _ in range(n)]
            vscales = [torch.ones(shape[:3], device=device, dtype=torch.float32) for _ in range(n)]
        return cls(keys, values, scales, vscales)

    @property
    def fp8(self) -> bool:
        return self.key_scales is not None

    @property
    def scratch_slot(self) -> int:
        return self.keys[0].shape[0] - 1

    def key_scale(self, layer: int) -> torch.Tensor | None:
        return None if self.key_scales is None else self.key_scales[layer]

    def value_scale(self, layer: int) -> torch.Tensor | None:
        return None if self.value_scales is None else self.value_scales[layer]

    @staticmethod
    def bytes_per_slot(config: LMConfig, dtype: torch.dtype, fp8: bool) -> int:
        """Device bytes one session's rings take (keys + values + scales)."""
        head_dim = config.dim // config.num_heads
        per_pos = config.num_layers * 2 * config.num_heads
        if fp8:
            return per_pos * config.kv_window * (head_dim + 4)
        return per_pos * config.kv_window * head_dim * torch.empty((), dtype=dtype).element_size()
