"""Instant start for lockstep sessions: the slot state right after the voice + persona prefill, kept per start.

A PersonaPlex session feeds its voice prompt and persona through the model before the agent may speak (~80-250
passes). That work depends only on (checkpoint, persona text, voice file), so the first session with a given
start snapshots its slot when the prefill ends, and every later session with the same start gets a copy of that
snapshot written into its slot instead of prefilling: it is live on its first tick.

What a slot holds after a prefill, and so what a snapshot copies: the token ring and its provided flags, the
pass count, and the temporal KV rings up to the prefill's length (positions past it are never read: a row reads
only ``min(pos + 1, context)`` positions). Codec streams are not part of it: the engine resets them when the
prefill ends anyway. Sampling RNG is not either: with greedy decoding a cached start is token-for-token identical
to a prefilled one (``tests/inference/test_prefill_cache.py``); with sampling it is a different draw of the same
distribution, as any two sessions are.

The cache is bounded (LRU by entries); a snapshot of the tiny test model is ~100 KB, one of the 7B at a 200-pass
prefill ~100 MB on the device (bf16), so ``max_entries`` is the memory knob.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.engines.base import SlotConfig
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.gen import LockstepGen

DEFAULT_MAX_ENTRIES = 8


@dataclass
class SlotSnapshot:
    """One slot's generation state after its prefill (tensors on the engine's device)."""

    cache: torch.Tensor  # [K, CT] token ring
    provided: torch.Tensor  # [K, CT] bool
    length: int  # model passes since reset
    keys: list[torch.Tensor]  # per layer [H, n, Dh]: the first n ring positions
    values: list[torch.Tensor]
    key_scales: list[torch.Tensor] | None = None  # per layer [H, n] (fp8 rings only)
    value_scales: list[torch.Tensor] | None = None

    @property
    def nbytes(self) -> int:
        tensors = [self.cache, self.provided, *self.keys, *self.values, *(self.key_scales or []),
                   *(self.value_scales or [])]  # fmt: skip
        return sum(t.numel() * t.element_size() for t in tensors)


def start_key(checkpoint: Path, config: SlotConfig, persona_default: str) -> str:
    """What a prefill depends on: the checkpoint, the persona text and the voice file (path, size, mtime)."""
    digest = hashlib.sha256()
    digest.update(str(Path(checkpoint).resolve()).encode())
    digest.update(b"\0" + (config.persona or persona_default).encode())
    path = config.voice.path if config.voice is not None else None
    if path is not None:
        stat = Path(path).stat()  # a missing file raises: the prefill itself reports it
        digest.update(f"\0{Path(path).resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


class PrefillCache:
    """Snapshots by start key, least recently used dropped first."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES):
        self.max_entries = max_entries
        self._entries: OrderedDict[str, SlotSnapshot] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Device bytes the snapshots hold."""
        return sum(snapshot.nbytes for snapshot in self._entries.values())

    def get(self, key: str) -> SlotSnapshot | None:
        snapshot = self._entries.get(key)
        if snapshot is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return snapshot

    def put(self, key: str, snapshot: SlotSnapshot) -> None:
        if self.max_entries <= 0:
            return
        self._entries[key] = snapshot
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


def snapshot_slot(state: LockstepGen | FastLockstep, slot: int) -> SlotSnapshot:
    """Copy ``slot``'s state out of the backend's generation state."""
    length = int(state.lengths[slot])
    if isinstance(state, LockstepGen):
        context = state.kv.keys.shape[3]
        n = min(length, context)
        keys = [state.kv.keys[layer, slot, :, :n].clone() for layer in range(state.kv.keys.shape[0])]
        values = [state.kv.values[layer, slot, :, :n].clone() for layer in range(state.kv.values.shape[0])]
        return SlotSnapshot(state.cache[slot].clone(), state.provided[slot].clone(), length, keys, values)
    kv = state.kv
    n = min(length, kv.window)
    return SlotSnapshot(
        state.cache[slot].clone(),
        state.provided[slot].clone(),
        length,
        kv.read_slot(kv.keys, slot, n),
        kv.read_slot(kv.values, slot, n),
        None if kv.key_scales is None else kv.read_slot(kv.key_scales, slot, n),
        None if kv.value_scales is None else kv.read_slot(kv.value_scales, slot, n),
    )


def restore_slot(state: LockstepGen | FastLockstep, slot: int, snapshot: SlotSnapshot) -> None:
    """Write a snapshot into ``slot`` (already reset), in place: captured graphs keep using the same tensors."""
    state.cache[slot].copy_(snapshot.cache)
    state.provided[slot].copy_(snapshot.provided)
    n = snapshot.keys[0].shape[1]
    if isinstance(state, LockstepGen):
        for layer, (k, v) in enumerate(zip(snapshot.keys, snapshot.values, strict=True)):
            state.kv.keys[layer, slot, :, :n].copy_(k)
            state.kv.values[layer, slot, :, :n].copy_(v)
        state.kv.lengths[slot] = snapshot.length
        return
    kv = state.kv
    if kv.pages.free_pages + len(kv.pages.held[slot]) < kv.pages.pages_for(n):
        raise RuntimeError(f"not enough free KV pages to restore {n} positions")
    state.set_passes([slot], [snapshot.length])
    kv.write_slot(kv.keys, slot, snapshot.keys)
    kv.write_slot(kv.values, slot, snapshot.values)
    if kv.key_scales is not None and snapshot.key_scales is not None and snapshot.value_scales is not None:
        kv.write_slot(kv.key_scales, slot, snapshot.key_scales)
        kv.write_slot(kv.value_scales, slot, snapshot.value_scales)
