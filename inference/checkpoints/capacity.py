"""How many sessions a GPU holds for a checkpoint's shape, by the engines' own KV arithmetic.

Nothing here allocates: the bytes of one session's KV come from the engines' own ``SlotKV.bytes_per_slot``
(lockstep fast path) and ``KVPool.bytes_per_slot`` (MiniCPM-o, built on the ``meta`` device), and the
call-length mix goes through ``PagePool.admissible``, the rule the paged lockstep engine admits by
(``PARLEY_KV_MEAN_CALL_S``): the estimate is the population at which that rule stops admitting when the live
calls' ages are those of the mix's steady state. The memory left for KV is the card less the weights (in the
serving dtype), the codec's per-slot streams and a reserve for CUDA graphs and workspaces, as
``bench/lockstep`` measured them on the H200 (``bench/notes/lockstep-gpu.md``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Protocol

from inference.models.moshi.fast.pages import PagePool, mix_population

GiB = 1024**3
FRAMES_PER_S = 12.5
# CUDA graphs of every bucket, attention tuning and allocator slack, as bench/lockstep reserves them.
GRAPH_RESERVE_GIB = 7.0
# Mimi's streaming state per lockstep slot (bench/lockstep/paged.py measured ~16.4 MB on the CPU build).
MIMI_STATE_BYTES_PER_SLOT = 16.5e6
PAGE_FRAMES = 128  # the page size measured best on the H200 (pages of 64 forbid 128-position blocks)
CALL_CAP_S = 600.0  # the mix's longest call (bench/lockstep CallMix: exponential, capped at 10 minutes)
SLOT_ROUND = 8
# slots beyond the expected population: it swings around its mean (193-266 around 230 on the H200)
SLOT_HEADROOM = 1.25


@dataclass
class CapacityPlan:
    """Sessions one GPU holds, and the settings that serve them.

    Attributes:
        gpu_gib: the card's memory, GiB.
        weight_bytes: the weights in the serving dtype.
        kv_bytes_per_session: one full-context session's KV (and per-slot streams).
        full_context_sessions: sessions that fit with every one at its full context (no paging).
        mix_sessions: sessions at the call-length mix (paged KV, admission by expected need); None when the
            engine has no paged KV (MiniCPM-o: a slot's KV is preallocated, so it equals the full count).
        mean_call_s: the mix's mean call length.
        settings: ``PARLEY_*`` variables to serve it at the mix (or at full context).
    """

    gpu_gib: float
    weight_bytes: int
    kv_bytes_per_session: int
    full_context_sessions: int
    mix_sessions: int | None
    mean_call_s: float
    settings: dict[str, str] = field(default_factory=dict)


def lockstep_plan(lm, gpu_gib: float, *, mean_call_s: float = 180.0, kv_fp8: bool = True,
                  weight_bytes: int | None = None, context: int = 0) -> CapacityPlan:  # fmt: skip
    """The Moshi / PersonaPlex plan (``lm`` an ``LMConfig``); weights default to the LM's parameters in bf16;
    ``context`` frames below the checkpoint's serve a shorter context (``PARLEY_LOCKSTEP_CONTEXT``)."""
    import torch

    from inference.models.moshi.fast.kv import SlotKV

    shorter = 0 < context < lm.context
    if shorter:
        lm = replace(lm, context=context)
    if weight_bytes is None:
        weight_bytes = 2 * lm_parameters(lm)
    free = gpu_gib * GiB - weight_bytes - GRAPH_RESERVE_GIB * GiB
    per_session = SlotKV.bytes_per_slot(lm, torch.bfloat16, kv_fp8)
    full = max(int(free // (per_session + MIMI_STATE_BYTES_PER_SLOT)), 0)
    per_page = per_session * PAGE_FRAMES / lm.kv_window  # as LockstepFastBackend sizes its pool

    def population(slots: int) -> int:  # the slots' codec state comes out of the pool
        pool_pages = max(int((free - slots * MIMI_STATE_BYTES_PER_SLOT) // per_page), 0)
        return mix_population(pool_pages, PAGE_FRAMES, lm.kv_window, mean_call_s * FRAMES_PER_S,
                              CALL_CAP_S * FRAMES_PER_S, limit=slots)  # fmt: skip

    # the most slots that the population they leave room for still needs (with headroom): mix(slots) falls
    # as slots take pool memory, so the fixed point is found by bisection
    low, high = SLOT_ROUND, max(SLOT_ROUND, min(int(free // MIMI_STATE_BYTES_PER_SLOT), 4 * full + SLOT_ROUND))
    while high - low > SLOT_ROUND:
        mid = _round_up((low + high) // 2)
        if mid >= high:
            break
        if _round_up(math.ceil(population(mid) * SLOT_HEADROOM)) >= mid:
            low = mid
        else:
            high = mid
    slots = low
    mix = population(slots)
    pool_gb = round(max(free - slots * MIMI_STATE_BYTES_PER_SLOT, 0) / 1e9, 1)
    settings = {
        "PARLEY_DEVICE": "cuda", "PARLEY_DTYPE": "bfloat16", "PARLEY_KV_DTYPE": "fp8" if kv_fp8 else "bf16",
        "PARLEY_SLOTS": str(slots), "PARLEY_KV_PAGE_FRAMES": str(PAGE_FRAMES), "PARLEY_KV_POOL_GB": str(pool_gb),
        "PARLEY_KV_MEAN_CALL_S": f"{mean_call_s:g}",
        **({"PARLEY_LOCKSTEP_CONTEXT": str(context)} if shorter else {}),
    }  # fmt: skip
    return CapacityPlan(gpu_gib, weight_bytes, per_session, full, mix, mean_call_s, settings)


def unit_plan(cfg, gpu_gib: float, *, weight_bytes: int, mean_call_s: float = 180.0) -> CapacityPlan:
    """The MiniCPM-o plan (``cfg`` a ``MiniCPMOConfig``): LLM and TTS KV pools preallocated per slot."""
    import torch

    from inference.models.minicpmo.fast.decoder import KVPool
    from inference.models.minicpmo.fast.runner import DEFAULT_CAPACITY

    def per_slot(layers: int, kv_heads: int, head_dim: int, capacity: int) -> int:
        pool = KVPool(layers=layers, kv_heads=kv_heads, head_dim=head_dim, num_slots=1, capacity=capacity,
                      device="meta", dtype=torch.bfloat16)  # fmt: skip
        return pool.bytes_per_slot()

    tts = cfg.tts
    per_session = per_slot(
        cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
        min(DEFAULT_CAPACITY, cfg.max_position_embeddings),
    ) + per_slot(
        tts.num_hidden_layers, tts.num_key_value_heads, tts.hidden_size // tts.num_attention_heads,
        tts.max_position_embeddings,
    )  # fmt: skip
    free = gpu_gib * GiB - weight_bytes - GRAPH_RESERVE_GIB * GiB
    full = max(int(free // per_session), 0)
    settings = {"PARLEY_DEVICE": "cuda", "PARLEY_DTYPE": "bfloat16", "PARLEY_SLOTS": str(max(full, 1))}
    return CapacityPlan(gpu_gib, weight_bytes, per_session, full, None, mean_call_s, settings)


def lm_parameters(lm) -> int:
    """Parameters of a ``MoshiLM(lm)``, counted on the meta device (no memory)."""
    import torch

    from inference.models.moshi.lm import MoshiLM

    with torch.device("meta"):
        return sum(t.numel() for t in MoshiLM(lm).state_dict().values())


def _round_up(n: int) -> int:
    return max(SLOT_ROUND, -(-n // SLOT_ROUND) * SLOT_ROUND)


# ---- the engine's admission replayed over a call mix -----------------------------------------------------------
# ``mix_population`` is where admission stops at the mix's steady state; what the engine *holds* swings around
# it for minutes at a time (calls admitted young grow old together). ``replay_mix`` drives an admission target
# -- ``PagePool`` alone here, the engine's own backend on a GPU (``bench/capacity_check.py``) -- through the
# churn ``bench/lockstep/paged.py`` serves, with no model step: admission reads only the calls' positions.


class CallMix:
    """Call lengths exponential with ``mean_s``, capped at ``cap_s``; in frames (the bench's churn draws these)."""

    def __init__(self, mean_s: float = 180.0, cap_s: float = CALL_CAP_S, seed: int = 0):
        self.mean_s, self.cap_s = mean_s, cap_s
        self.rng = random.Random(seed)

    def length(self) -> int:
        return max(1, round(min(self.rng.expovariate(1.0 / self.mean_s), self.cap_s) * FRAMES_PER_S))

    def in_progress(self) -> tuple[int, int]:
        """(age, frames left) of a call found in progress at a random moment: its length is drawn in proportion
        to the length (a long call is more likely to be under way), its age uniformly within it."""
        cap = round(self.cap_s * FRAMES_PER_S)
        while True:
            length = self.length()
            if self.rng.random() < length / cap:
                age = self.rng.randrange(length)
                return age, length - age

    def mean_context_frames(self, window: int, samples: int = 200_000) -> float:
        """Expected KV positions a session in progress holds (``min(age, window)``), by sampling."""
        return sum(min(self.in_progress()[0], window) for _ in range(samples)) / samples


class AdmissionTarget(Protocol):
    """What ``replay_mix`` drives: slots opened at an age, advanced a pass at a time, closed, and asked how many
    more calls (starting at ``new_positions``) the KV memory admits."""

    def open(self, slot: int, age: int) -> None: ...
    def advance(self, slots: list[int]) -> None: ...
    def close(self, slot: int) -> None: ...
    def admissible(self, new_positions: int) -> int: ...


@dataclass
class PoolTarget:
    """A bare ``PagePool``: the engine's admission bookkeeping without the device (``FastBackend`` does the same
    ``grow`` / ``release`` / ``admissible`` calls on its pool)."""

    pages: PagePool
    mean_call_frames: float
    passes: dict[int, int] = field(default_factory=dict)

    def open(self, slot: int, age: int) -> None:
        self.pages.grow(slot, 1)
        self.passes[slot] = age
        if age:
            self.pages.grow(slot, min(age, self.pages.window))

    def advance(self, slots: list[int]) -> None:
        for slot in slots:
            self.pages.grow(slot, self.passes[slot] + 1)
            self.passes[slot] += 1

    def close(self, slot: int) -> None:
        self.pages.release(slot)
        del self.passes[slot]

    def admissible(self, new_positions: int) -> int:
        window = self.pages.window
        live = [(s, min(p, window)) for s, p in self.passes.items()]
        return self.pages.admissible(live, self.mean_call_frames, new_positions=min(new_positions, window))


def replay_mix(target: AdmissionTarget, mix: CallMix, slots: int, ticks: int, warm: int = 80) -> dict[str, float]:
    """Callers always waiting, admitted by ``target``'s memory, each staying for a ``mix`` call length, from the
    mix's steady state (as bench/lockstep/paged.py's churn, in the same order of draws): the calls held per tick
    after ``warm`` ticks (min, mean, max)."""
    free = list(range(slots - 1, -1, -1))
    left: dict[int, int] = {}
    while free:  # the steady state: calls in progress, admitted as long as admission takes them
        age, frames_left = mix.in_progress()
        if target.admissible(age) < 1:
            break
        slot = free.pop()
        target.open(slot, age)
        left[slot] = frames_left
    initial, held = len(left), []
    for tick in range(warm + ticks):
        for slot in [s for s, n in left.items() if n <= 0]:
            target.close(slot)
            del left[slot]
            free.append(slot)
        for _ in range(min(target.admissible(0), len(free))):
            slot = free.pop()
            target.open(slot, 0)
            left[slot] = mix.length()
        target.advance(list(left))
        for slot in left:
            left[slot] -= 1
        if tick >= warm:
            held.append(len(left))
    for slot in list(left):  # hand the memory back: a second replay on the same target starts from an empty pool
        target.close(slot)
    return {"initial": initial, "min": min(held), "mean": round(sum(held) / len(held), 1), "max": max(held),
            "ticks": ticks}  # fmt: skip
