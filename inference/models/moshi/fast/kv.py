"""Paged per-slot KV rings of the temporal transformer, in the model dtype or in fp8 (e4m3) with per-vector scales.

Each slot's ring of ``W = config.kv_window`` positions (the checkpoint's ``context``, one fewer for PersonaPlex:
see ``LMConfig.kv_window``) is made of pages of ``page_size`` positions: a slot's frame at position p lives at
ring position ``r = p % windows[slot]``, in physical page ``page_table[slot, r // page_size]`` at offset
``r % page_size``. The physical pages of all slots share one pool per layer; ``pages.PagePool`` hands them out
as a slot's context grows and takes them back when its session ends. Contiguous rings are the case
``page_size == W``: one page per slot.

Slot ``num_slots`` is a scratch slot: padding rows of a batch bucket point there, and its table points at the
trash page, so their writes never touch a live session. Nothing needs clearing on reset: a row only ever reads
the first ``min(pos + 1, windows[slot])`` positions of its ring, and each was written by the same session
before it is read.

Memory per full slot: ``layers x 2 x heads x W x head_dim`` bytes in fp8 (0.79 GB for the 7B at 3000 frames,
half of bf16) plus ``layers x 2 x heads x W`` fp32 scales (25 MB).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.models.moshi.config import LMConfig
from inference.models.moshi.fast.ops import FP8_DTYPE, KVLayer
from inference.models.moshi.fast.pages import PageChange, PagePool

logger = logging.getLogger(__name__)


@dataclass
class SlotKV:
    """The page pools of every layer, the page table, and the host page bookkeeping.

    Attributes:
        keys, values: per layer [num_pages, heads, page_size, head_dim].
        key_scales, value_scales: per layer [num_pages, heads, page_size] fp32, only for fp8 rings.
        page_table: [num_slots + 1, pages_per_slot] long: the physical page of each logical page.
        windows: [num_slots + 1] long: each slot's ring length (``W`` unless the pool ran dry; ``pages``).
        pages: which pages each slot holds (host side).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_scales: list[torch.Tensor] | None
    value_scales: list[torch.Tensor] | None
    page_table: torch.Tensor
    windows: torch.Tensor
    pages: PagePool

    @classmethod
    def allocate(
        cls,
        config: LMConfig,
        num_slots: int,
        device,
        dtype: torch.dtype,
        fp8: bool = False,
        page_size: int | None = None,
        num_pages: int | None = None,
    ) -> SlotKV:
        """Pools for ``num_slots`` sessions.

        Args:
            page_size: ring positions per page; None for contiguous rings (one page of ``W`` per slot).
            num_pages: physical pages besides the trash page; None for every slot's full window (no
                overcommit: the pool never runs dry).
        """
        window = config.kv_window
        page_size = page_size or window
        pages = PagePool(
            num_pages=1 + (num_pages if num_pages is not None else num_slots * -(-window // page_size)),
            page_size=page_size,
            window=window,
            num_slots=num_slots,
        )
        shape = (pages.num_pages, config.num_heads, page_size, config.dim // config.num_heads)
        ring_dtype = FP8_DTYPE if fp8 else dtype
        n = config.num_layers
        keys = [torch.zeros(shape, device=device, dtype=ring_dtype) for _ in range(n)]
        values = [torch.zeros(shape, device=device, dtype=ring_dtype) for _ in range(n)]
        scales = vscales = None
        if fp8:
            scales = [torch.ones(shape[:3], device=device, dtype=torch.float32) for _ in range(n)]
            vscales = [torch.ones(shape[:3], device=device, dtype=torch.float32) for _ in range(n)]
        table = torch.zeros((num_slots + 1, pages.pages_per_slot), device=device, dtype=torch.long)
        windows = torch.full((num_slots + 1,), window, device=device, dtype=torch.long)
        return cls(keys, values, scales, vscales, table, windows, pages)

    @property
    def fp8(self) -> bool:
        return self.key_scales is not None

    @property
    def scratch_slot(self) -> int:
        return self.page_table.shape[0] - 1

    @property
    def page_size(self) -> int:
        return self.pages.page_size

    @property
    def window(self) -> int:
        return self.pages.window

    def layer(self, i: int) -> KVLayer:
        """What the kernels need of layer i."""
        return KVLayer(
            self.keys[i],
            self.values[i],
            None if self.key_scales is None else self.key_scales[i],
            None if self.value_scales is None else self.value_scales[i],
            self.page_table,
            self.windows,
            self.window,
        )

    # ---- pages (host side, between passes) -------------------------------------------------------------

    def grow(self, slots: Sequence[int], positions: Sequence[int]) -> None:
        """Before a pass: slot ``slots[i]`` gets the pages its first ``positions[i]`` ring positions need."""
        changes = []
        capped_before = self.pages.capped_slots
        for slot, n in zip(slots, positions, strict=True):
            changes += self.pages.grow(slot, n)
        self._apply(changes)
        if self.pages.capped_slots != capped_before:  # rare: only then look for the rings that shrank
            shrunk = [s for s in slots if self.pages.windows[s] != self.window]
            self.windows[shrunk] = torch.tensor([self.pages.windows[s] for s in shrunk]).to(self.windows)
            # degraded, not dropped: these calls attend over a shorter past from now on (admission should make
            # this rare; a steady trickle means PARLEY_KV_MEAN_CALL_S is below the real call length)
            logger.warning("kv.pool_dry_ring_shrank", extra={"slots": shrunk, "windows": self.windows[shrunk].tolist()})

    def release(self, slot: int) -> None:
        """The slot's session ended (or restarts): its pages go back to the pool."""
        capped = self.pages.windows[slot] != self.window
        self._apply(self.pages.release(slot))
        if capped:
            self.windows[slot] = self.window

    def _apply(self, changes: list[PageChange]) -> None:
        if not changes:
            return
        where = torch.tensor([(c.slot, c.index) for c in changes], dtype=torch.long)
        pages = torch.tensor([c.page for c in changes], dtype=torch.long).to(self.page_table.device)
        self.page_table[where[:, 0].to(pages.device), where[:, 1].to(pages.device)] = pages

    def read_slot(self, pools: list[torch.Tensor], slot: int, n: int) -> list[torch.Tensor]:
        """Copies of ring positions ``0 .. n-1`` of ``slot`` from each layer's pool: [heads, n, ...]."""
        count = self.pages.pages_for(n)
        table = self.page_table[slot, :count]
        out = []
        for pool in pools:
            pages = pool[table]  # [count, H, P, ...]
            joined = pages.transpose(0, 1).reshape(pages.shape[1], count * self.page_size, *pages.shape[3:])
            out.append(joined[:, :n].clone())
        return out

    def write_slot(self, pools: list[torch.Tensor], slot: int, data: list[torch.Tensor]) -> None:
        """Write [heads, n, ...] per layer into ring positions ``0 .. n-1`` of ``slot`` (pages already held)."""
        P = self.page_size
        for pool, layer_data in zip(pools, data, strict=True):
            n = layer_data.shape[1]
            for index in range(self.pages.pages_for(n)):
                page = self.pages.held[slot][index]
                part = layer_data[:, index * P : min((index + 1) * P, n)]
                pool[page, :, : part.shape[1]].copy_(part)

    @staticmethod
    def bytes_per_slot(config: LMConfig, dtype: torch.dtype, fp8: bool) -> int:
        """Device bytes one session's full rings take (keys + values + scales)."""
        head_dim = config.dim // config.num_heads
        per_pos = config.num_layers * 2 * config.num_heads
        if fp8:
            return per_pos * config.kv_window * (head_dim + 4)
        return per_pos * config.kv_window * head_dim * torch.empty((), dtype=dtype).element_size()

    def bytes_per_page(self) -> int:
        t = [self.keys[0], self.values[0], *((self.key_scales or [])[:1]), *((self.value_scales or [])[:1])]
        return len(self.keys) * sum(x[0].numel() * x.element_size() for x in t)
