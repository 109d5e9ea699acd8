"""Which lockstep backend steps the slots: the one place that picks, above both backends' modules."""

from __future__ import annotations

import torch

from inference.engines.lockstep_backends import BACKENDS, EagerBackend, LockstepBackend
from inference.engines.lockstep_fast_backend import FastBackend, KVPaging
from inference.models.moshi.gen import SamplingConfig
from inference.models.moshi.lm import MoshiLM
from inference.models.moshi.mimi import MimiCodec


def choose_backend(
    requested: str,
    lm: MoshiLM,
    codec: MimiCodec,
    num_slots: int,
    sampling: SamplingConfig,
    *,
    kv_fp8: bool | None = None,
    seed: int = 0,
    paging: KVPaging | None = None,
) -> LockstepBackend:
    """The one place that picks the stepper: ``auto`` is the fast path (graphed on CUDA, torch twins on CPU).

    Args:
        requested: ``auto``, ``eager`` or ``fast``.
        kv_fp8: fp8 KV rings for the fast path; None means on for bfloat16 on CUDA (serving), off otherwise
            (float32 keeps the fast path token-exact against the eager one).

    Raises:
        ValueError: an unknown backend name.
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {requested!r}")
    device = lm.text_emb.weight.device
    dtype = lm.text_emb.weight.dtype
    name = "fast" if requested == "auto" else requested
    if name == "eager":
        return EagerBackend(lm, codec, num_slots, sampling, seed=seed)
    if kv_fp8 is None:
        kv_fp8 = device.type == "cuda" and dtype == torch.bfloat16
    return FastBackend(lm, codec, num_slots, sampling, kv_fp8=kv_fp8, seed=seed, paging=paging)
