"""Warm-up tuning of the decode attention launch per batch bucket, on the engine's own rings.

At full context the attention reads every slot's whole ring each tick (0.79 GB per session per tick in fp8),
so at 128 sessions it is most of the tick; how many bytes each SM keeps in flight (block size, warps, context
splits) decides whether that read runs near the memory bandwidth. The best launch depends on the bucket, so
each bucket is timed once at start-up with CUDA events, before the graphs are captured.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence

import torch

from inference.models.moshi.fast import ops
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.fast.model import FastLM, default_attention_launch

logger = logging.getLogger(__name__)


def candidate_launches(rows: int, heads: int, page_size: int | None = None) -> list[ops.AttentionLaunch]:
    """Launches worth timing; with pages (``page_size``), only blocks that divide a page."""
    base = default_attention_launch(rows, heads).splits
    splits = sorted({s for s in (base, 2 * base, 4 * base) if s <= 32})
    blocks = (32, 64, 128) if rows < 32 else (64, 128)
    if page_size is not None:
        blocks = tuple(b for b in blocks if page_size % b == 0) or (_largest_block(page_size),)
    if rows < 32:  # attention is a small part of a small bucket's tick: a short search
        grid = itertools.product(splits, blocks, (4, 8), (2,))
    else:  # at full context the ring read is most of the tick: search pipelining depth too
        grid = itertools.product(splits, blocks, (4, 8), (2, 3, 4))
    return [ops.AttentionLaunch(splits=s, block_n=b, warps=w, stages=st) for s, b, w, st in grid]


def _largest_block(page_size: int) -> int:
    """The largest power of two up to 128 that divides ``page_size``."""
    block = 128
    while page_size % block:
        block //= 2
    return block


@torch.no_grad()
def tune_attention(fl: FastLM, kv: SlotKV, buckets: Sequence[int], repeats: int = 5) -> dict[int, dict]:
    """Time every candidate launch of each bucket at full context (layer 0's rings) and keep the fastest.

    Sets ``fl.attention_launch[bucket]``. Returns, per bucket, the chosen launch, its time and the ring
    bytes per second it reached (the numbers the benchmark reports).
    """
    if not ops.use_triton(kv.keys[0]):
        return {}
    c = fl.config
    H, D, C = c.num_heads, c.dim // c.num_heads, c.kv_window
    paged = kv.page_table.shape[1] > 1
    report = {}
    for rows in buckets:
        layer = _full_windows(kv, rows)
        slot_ids = torch.arange(rows, device=kv.keys[0].device)
        lengths = torch.full((rows,), C, device=slot_ids.device, dtype=torch.long)
        q = torch.randn(rows, H, D, device=slot_ids.device, dtype=fl.dtype)
        ring_bytes = rows * H * C * (2 * D * kv.keys[0].element_size() + (8 if kv.fp8 else 0))
        best = None
        for launch in candidate_launches(rows, H, kv.page_size if paged else None):
            args = (q, layer, slot_ids, lengths, launch)
            try:
                ops.decode_attention(*args)  # compile
            except Exception:  # noqa: BLE001 - a launch the compiler rejects (e.g. out of shared memory) is skipped
                logger.warning("attention.launch_skipped", extra={"launch": dataclasses.asdict(launch)})
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(repeats):
                start.record()
                ops.decode_attention(*args)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            ms = sorted(times)[len(times) // 2]
            if best is None or ms < best[1]:
                best = (launch, ms)
        if best is None:  # every candidate was rejected: the bucket keeps default_attention_launch
            logger.warning("attention.tuning_failed", extra={"rows": rows})
            continue
        fl.attention_launch[rows] = best[0]
        report[rows] = {
            "launch": dataclasses.asdict(best[0]),
            "ms_per_layer": round(best[1], 4),
            "ring_TBps": round(ring_bytes / (best[1] * 1e-3) / 1e12, 2),
        }
    return report


def _full_windows(kv: SlotKV, rows: int) -> ops.KVLayer:
    """Layer 0 as if ``rows`` sessions each held a full window of distinct pages (wrapping round the pool when
    it is smaller), so the timed read comes from memory, not from a page that sits in L2."""
    per_slot = kv.page_table.shape[1]
    usable = kv.pages.usable_pages
    table = 1 + torch.arange(rows * per_slot, device=kv.page_table.device).view(rows, per_slot) % usable
    windows = torch.full((rows,), kv.window, device=table.device, dtype=torch.long)
    return dataclasses.replace(kv.layer(0), page_table=table, windows=windows)


@torch.no_grad()
def check_fused_gemv(fl: FastLM) -> bool:
    """Run the fused small-GEMV kernels once on the depformer's real weights against plain torch.

    Returns whether they are used: on a mismatch or a compile failure ``fl.fused_gemv_max_rows`` is set to 0
    and the depformer falls back to cuBLAS for every batch size.
    """
    if not ops.use_triton(fl.depformer_in) or fl.fused_gemv_max_rows == 0:
        return False
    w = fl.dep_steps[0][0]
    norm1, _ = fl.dep_norms[0]
    x = torch.randn(2, w.in_proj.shape[1], device=fl.device, dtype=fl.dtype)
    try:
        got = ops.small_gemv(x, w.in_proj, norm_alpha=norm1, eps=fl.eps).float()
    except Exception:  # noqa: BLE001 - any compiler or launch failure means: do not use the fused path
        logger.warning("fused_gemv.disabled", exc_info=True)
        fl.fused_gemv_max_rows = 0
        return False
    want = (ops.rmsnorm_torch(x, norm1, fl.eps) @ w.in_proj.t()).float()
    if not bool(((got - want).norm() / want.norm()) < 1e-2):
        logger.warning("fused_gemv.mismatch")
        fl.fused_gemv_max_rows = 0
        return False
    return True
