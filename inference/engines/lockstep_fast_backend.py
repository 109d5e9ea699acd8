"""The lockstep engine's fast stepper, ``FastBackend``, and the layout of its KV memory, ``KVPaging``.

The fast path of ``inference.models.moshi.fast`` behind the ``LockstepBackend`` interface
(``lockstep_backends``): per-slot state stepped over the active rows only, one CUDA graph per batch bucket,
Triton kernels, fp8 KV (bf16), graphed batched Mimi; on CPU the same objects run their torch twins eagerly.
With ``KVPaging`` the KV is paged (``fast/pages.py``): the backend hands out pages as calls grow, takes them
back when they end, and tells admission how many more calls its memory takes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.engines.base import EngineCapacity
from inference.engines.lockstep_backends import (
    LockstepBackend,
    StepResult,
    StepRows,
    restore_codec_rows,
    save_codec_rows,
)
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.fast.pages import mix_population
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.gen import SamplingConfig
from inference.models.moshi.lm import MoshiLM
from inference.models.moshi.mimi import MimiCodec

logger = logging.getLogger(__name__)
FRAME_S = 0.08
# the longest call admission's mix assumes: 10 minutes (the mix bench/lockstep serves: exponential, capped there)
CALL_CAP_FRAMES = 7500
# Passes between two fresh estimates of what the page pool admits (a session opening or ending refreshes it at
# once). The estimate looks over the live calls' whole remaining lives with a 3-sd margin: the few positions each
# call adds in the meantime move it by a fraction of one page. Estimated on every pass it cost the worker 1.2 ms
# of each tick at ~120 calls on an H100 (bench/notes/serving-e2e.md), host time the tick's budget pays for.
ADMISSIBLE_REFRESH_PASSES = 6


@dataclass(frozen=True)
class KVPaging:
    """The fast path's KV layout (``PARLEY_KV_PAGE_FRAMES``, ``PARLEY_KV_POOL_GB``, ``PARLEY_KV_MEAN_CALL_S``).

    Attributes:
        page_frames: positions per page; 0 = contiguous rings (each slot's whole window up front).
        pool_gb: device memory of the page pool; 0 = every slot's full window (no overcommit).
        mean_call_frames: the call length admission plans for (``PagePool.admissible``).
    """

    page_frames: int = 0
    pool_gb: float = 0.0
    mean_call_frames: int = 2250  # 3 minutes


class FastBackend(LockstepBackend):
    """The fast path: per-slot state, a row step over the active slots only, graphs and Triton on CUDA.

    Warm-up follows the fast path's recipe: ``FastLM`` -> ``FastLockstep`` -> attention tuning per bucket ->
    fused-GEMV self-check -> capture of every bucket -> ``GraphedMimi`` capture. On CPU tuning and capture are
    no-ops and the same ``GraphedLockstep.step`` / ``GraphedMimi`` calls run the torch twins eagerly.

    Args:
        lm: the loaded model.
        codec: the Mimi codec on the same device.
        num_slots: sessions served; a pass has at most this many rows.
        sampling: decoding settings.
        kv_fp8: fp8 e4m3 KV rings (half the memory; numerics differ from the eager path).
        seed: seeds the fused sampler's per-row RNG counters (CUDA) or the torch sampler's generator (CPU).
        paging: KV pages and the pool's size (contiguous rings for every slot by default).
    """

    name = "fast"

    def __init__(
        self,
        lm: MoshiLM,
        codec: MimiCodec,
        num_slots: int,
        sampling: SamplingConfig,
        *,
        kv_fp8: bool = False,
        seed: int = 0,
        paging: KVPaging | None = None,
    ):
        from inference.models.moshi.fast.codec import GraphedMimi
        from inference.models.moshi.fast.graphs import DEFAULT_BUCKETS, GraphedLockstep
        from inference.models.moshi.fast.model import FastLM

        super().__init__(lm, codec, num_slots)
        self.fast_lm = FastLM(lm)
        self.paging = paging = paging or KVPaging()
        page_frames = paging.page_frames or None
        pool_pages = None
        if page_frames and paging.pool_gb > 0:
            per_page = SlotKV.bytes_per_slot(lm.config, self.dtype, kv_fp8) * page_frames / lm.config.kv_window
            pool_pages = max(int(paging.pool_gb * 1e9 // per_page), 1)
        self.lockstep = FastLockstep(
            self.fast_lm,
            num_slots,
            max_rows=num_slots,
            sampling=sampling,
            kv_fp8=kv_fp8,
            kv_page_size=page_frames,
            kv_pages=pool_pages,
        )
        self.state = self.lockstep
        seeds = torch.Generator().manual_seed(seed)
        self.lockstep.seeds.copy_(torch.randint(0, 2**31 - 1, self.lockstep.seeds.shape, generator=seeds))
        if self.device.type == "cpu":  # no graphs here, so a private generator is safe (and seeds the session)
            self.lockstep.generator = torch.Generator().manual_seed(seed)
        self.graphed = GraphedLockstep(self.lockstep, DEFAULT_BUCKETS)
        self.mimi = GraphedMimi(codec, num_slots, personaplex=lm.config.personaplex)
        self.tuning: dict[int, dict] = {}
        self.fused_gemv = False
        self._capacity: EngineCapacity | None = None  # the pool never changes size: computed once
        self._admissible: int | None = None  # the last estimate, until a session opens or ends or it ages out
        self._passes_since_estimate = 0
        self._open: set[int] = set()  # slots holding a session (claimed, not yet released): their codec rows stay

    def warmup(self) -> None:
        from inference.models.moshi.fast.tuning import check_fused_gemv, tune_attention

        self.tuning = tune_attention(self.fast_lm, self.lockstep.kv, self.graphed.buckets)
        self.fused_gemv = check_fused_gemv(self.fast_lm)
        self.graphed.capture()  # CUDA: every bucket, on the scratch slot only
        self.mimi.capture()  # CUDA: encode and decode over all rows; streams fresh afterwards
        self._tick_every_slot_then_reset()
        logger.info(
            "lockstep.fast_ready",
            extra={"graphs": sorted(self.graphed.graphs), "mimi_graphed": self.mimi_graphed, "fused": self.fused_gemv},
        )

    @property
    def mimi_graphed(self) -> bool:
        return self.mimi.graphed

    def reset_slot(self, slot: int) -> None:
        self._admissible = None  # the slot's pages go back
        self._open.discard(slot)
        self.lockstep.reset_slot(slot)
        self.mimi.reset_slot(slot)

    def reset_codec(self, slot: int) -> None:
        self.mimi.reset_slot(slot)

    def restore_token_cache(self, slot: int, cache: torch.Tensor) -> None:
        self.lockstep.restore_token_cache(slot, cache)

    def claim_kv(self, slot: int) -> bool:
        self._admissible = None
        if not self.lockstep.claim_first_page(slot):
            return False
        self._open.add(slot)
        return True

    def _tick_every_slot_then_reset(self) -> None:
        with self.lockstep.trash_pages():  # a paged pool may hold fewer pages than there are slots
            super()._tick_every_slot_then_reset()

    def release_kv(self, slot: int) -> None:
        self._admissible = None
        self._open.discard(slot)
        self.lockstep.kv.release(slot)

    def capacity(self) -> EngineCapacity:
        """What the page pool admits: full windows it holds, and the population ``PagePool.admissible`` holds at
        the planned call mix (``mix_population``, the arithmetic ``python -m inference doctor`` estimates with)."""
        if self._capacity is None:
            pages = self.lockstep.kv.pages
            full = min(self.num_slots, pages.usable_pages // pages.pages_per_slot)
            if full >= self.num_slots:  # every slot's full window fits: the slots are the limit
                self._capacity = EngineCapacity.by_slots(self.num_slots)
            else:
                mean = self.paging.mean_call_frames
                mix = mix_population(pages.usable_pages, pages.page_size, pages.window, mean,
                                     CALL_CAP_FRAMES, limit=self.num_slots)  # fmt: skip
                self._capacity = EngineCapacity(self.num_slots, full, mix, round(mean * FRAME_S, 1))
        return self._capacity

    def admissible_sessions(self) -> int | None:
        pages = self.lockstep.kv.pages
        if pages.usable_pages >= self.num_slots * pages.pages_per_slot:
            return None  # every slot's full window fits: nothing to ration
        if self._admissible is not None and self._passes_since_estimate < ADMISSIBLE_REFRESH_PASSES:
            return self._admissible
        live = [(s, min(self.lockstep.passes[s], pages.window)) for s in range(self.num_slots) if pages.held[s]]
        self._admissible = pages.admissible(live, self.paging.mean_call_frames)
        self._passes_since_estimate = 0
        return self._admissible

    @torch.no_grad()
    def step(self, rows: StepRows, pcm: torch.Tensor | None = None, frozen: Sequence[int] = ()) -> StepResult:
        dev, n_live = self.device, rows.num_live
        self._passes_since_estimate += 1
        # Slot ids go to the device: the engine only hands over open, distinct slots, so the fast path's host
        # re-check (and the sync it would take on device-side user codes) is not needed.
        ids = torch.tensor(rows.slots, dtype=torch.long).to(dev)
        forced, mask = rows.forced.to(dev), rows.forced_mask.to(dev)
        embeddings = use_embeddings = None
        if rows.embeddings is not None and rows.use_embeddings is not None:
            embeddings = rows.embeddings.to(dev, self.dtype)
            use_embeddings = rows.use_embeddings.to(dev)
        saved = None
        if n_live:
            assert pcm is not None, "live rows need their audio"
            # the codec runs over the rows up to the highest live one; a call left on a high row moves down
            self.mimi.compact(self._open)
            codec_rows, highest = self.mimi.rows_of(rows.slots[:n_live])
            saved = save_codec_rows(self.mimi.state, [self.mimi.row_of[s] for s in frozen]) if frozen else None
            codes = self.mimi.encode(pcm.to(dev).view(n_live, 1, -1), codec_rows, highest)  # [n_live, 8]
            forced[:n_live, self._user_columns()] = codes
        tokens, valid = self.graphed.step(ids, forced, mask, embeddings, use_embeddings, slots=rows.slots)
        pcm_out = None
        if n_live:
            agent = self.agent_codes(tokens[:n_live], valid[:n_live])
            decoded = self.mimi.decode(agent, codec_rows, highest)[:, 0]  # [n_live, frame]
            if saved is not None:
                restore_codec_rows(self.mimi.state, saved)
            pcm_out = decoded.cpu()
        return StepResult(tokens.cpu(), valid.cpu(), pcm_out)

    def memory_snapshot(self) -> dict[str, float]:
        kv = self.lockstep.kv
        tensors = kv.keys + kv.values + (kv.key_scales or []) + (kv.value_scales or [])
        ring = sum(t.numel() * t.element_size() for t in tensors)
        # FastLM borrows the LM's weights, except two stacked copies (audio embeddings, depformer inputs)
        copies = (self.fast_lm.audio_emb, self.fast_lm.depformer_in)
        weights = sum(p.numel() * p.element_size() for p in (*self.lm.parameters(), *copies))
        pages = kv.pages
        in_use = (pages.usable_pages - pages.free_pages) * kv.bytes_per_page()
        # lm_kv_in_use_bytes: what the live calls' pages hold (all of lm_kv_bytes is allocated up front)
        return {"lm_kv_bytes": float(ring), "lm_kv_in_use_bytes": float(in_use), "lm_weight_bytes": float(weights)}
