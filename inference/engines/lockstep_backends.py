"""Steppers of the lockstep engine: the device work of one tick, behind one small interface.

``LockstepEngine`` decides *what* a tick does (which slots are live, which prefill frame each joining slot
feeds, which paused slots must stay frozen); a ``LockstepBackend`` does it on the device:

- ``FastBackend`` (``lockstep_fast_backend``, with its KV paging settings): the fast path of
  ``inference.models.moshi.fast``: per-slot state stepped over the active rows
  only, one CUDA graph per batch bucket, Triton kernels, fp8 KV rings (bf16), graphed batched Mimi. On CPU the
  same objects run their plain-torch twins eagerly. The default on both devices: on this CPU it measured faster
  than the eager path (``bench/lockstep_cpu.py --backend``: 2 sessions p50 12.7 vs 15.1 ms, p99 14.1 vs 17.0 ms;
  a joining prefill in 19 vs 26 ticks), because it steps only the active rows.
- ``EagerBackend``: the native path, ``gen.LockstepGen`` over the whole batch with an execution mask and the eager
  Mimi codec; token-exact against moshi 0.2.13 and kept as the reference the fast backend is tested against.

``inference.engines.lockstep_backend_choice.choose_backend`` is the one place that picks between them.

One backend ``step`` is one LM pass over a set of rows, live rows first: the live rows' audio is encoded, their
user codes forced, the pass runs (prefill rows ride along), the live rows' agent codes are decoded, and tokens
and PCM come back to the host in one go. Codec rows of paused slots are saved and put back around the codec
calls, because Mimi has no execution mask.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.engines.base import EngineCapacity
from inference.models.moshi.config import LMConfig
from inference.models.moshi.fast.step import FastLockstep
from inference.models.moshi.gen import LockstepGen, SamplingConfig
from inference.models.moshi.lm import MoshiLM
from inference.models.moshi.mimi import MimiCodec, per_row_tensors, state_tensors
from inference.models.moshi.personaplex import SILENCE_TOKENS

BACKENDS = ("auto", "eager", "fast")
USER_CODEBOOKS = 8


@dataclass
class StepRows:
    """One LM pass's inputs, one row per slot; the first ``num_live`` rows are live slots.

    Attributes:
        slots: slot of each row, distinct.
        forced: [n, K] long host tensor; live rows' user columns are filled by the backend from their audio.
        forced_mask: [n, K] bool host tensor (live rows: the user columns).
        embeddings: [n, dim] float host tensor replacing token embeddings where ``use_embeddings``, or None.
        use_embeddings: [n] bool host tensor, or None.
        num_live: how many leading rows are live (their audio is in ``step``'s ``pcm``).
    """

    slots: list[int]
    forced: torch.Tensor
    forced_mask: torch.Tensor
    embeddings: torch.Tensor | None = None
    use_embeddings: torch.Tensor | None = None
    num_live: int = 0


@dataclass
class StepResult:
    """One pass's outputs on the host: tokens [n, 1 + dep_q], valid [n], pcm [num_live, frame] (or None)."""

    tokens: torch.Tensor
    valid: torch.Tensor
    pcm: torch.Tensor | None


class LockstepBackend(abc.ABC):
    """The device side of the lockstep engine for ``num_slots`` slots.

    Attributes:
        name: ``eager`` or ``fast``.
        codec: the Mimi codec (also used eagerly, with a private stream, for ``.wav`` voice prompts).
        ct: token ring length (``max_delay + 3``).
        state: the generation state, whose ``cache`` / ``provided`` / ``lengths`` are indexed by slot
            (``LockstepGen`` or ``FastLockstep``).
    """

    name: str
    codec: MimiCodec
    ct: int
    state: LockstepGen | FastLockstep

    def __init__(self, lm: MoshiLM, codec: MimiCodec, num_slots: int):
        self.lm = lm
        self.config: LMConfig = lm.config
        self.codec = codec
        self.num_slots = num_slots
        self.device = lm.text_emb.weight.device
        self.dtype = lm.text_emb.weight.dtype
        self.ct = self.config.max_delay + 3
        self.silence = torch.tensor(SILENCE_TOKENS, device=self.device, dtype=torch.long).view(1, USER_CODEBOOKS)

    @abc.abstractmethod
    def warmup(self) -> None:
        """Compile / capture / touch everything the first real tick needs; every slot starts fresh after."""

    @abc.abstractmethod
    def reset_slot(self, slot: int) -> None:
        """A new session in ``slot``: fresh token ring, KV and codec streams for that slot only."""

    @abc.abstractmethod
    def reset_codec(self, slot: int) -> None:
        """Fresh codec streams for ``slot`` (its live audio starts after the prefill)."""

    @abc.abstractmethod
    def restore_token_cache(self, slot: int, cache: torch.Tensor) -> None:
        """Overwrite the slot's token ring with a voice prompt's saved ring [K, CT]."""

    @abc.abstractmethod
    def step(self, rows: StepRows, pcm: torch.Tensor | None = None, frozen: Sequence[int] = ()) -> StepResult:
        """One pass over ``rows``; ``pcm`` [num_live, frame] host float32 is the live rows' audio.

        Slots in ``frozen`` (live but paused this tick) keep their codec streams exactly as they were.
        Returns only once the results are on the host (so the caller's wall clock measures the device work).
        """

    def claim_kv(self, slot: int) -> bool:
        """Reserve the KV that a freshly reset ``slot``'s first pass writes; False when memory is full.
        Rings allocated up front always have it."""
        return True

    def release_kv(self, slot: int) -> None:  # noqa: B027 - only paged KV gives anything back
        """The slot's session ended: give its KV back (the slot stays frozen until the next reset)."""

    def admissible_sessions(self) -> int | None:
        """How many more sessions the KV memory admits now; None when only the slot count limits it."""
        return None

    def capacity(self) -> EngineCapacity:
        """Sessions the KV memory admits (every slot's full context, unless paged KV says fewer)."""
        return EngineCapacity.by_slots(self.num_slots)

    def slot_state(self, slot: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(token ring [K, CT], provided mask [K, CT], model passes since reset) of ``slot``, on the host."""
        return self.state.cache[slot].cpu(), self.state.provided[slot].cpu(), int(self.state.lengths[slot])

    @abc.abstractmethod
    def memory_snapshot(self) -> dict[str, float]:
        """KV ring and weight bytes of the LM."""

    def agent_codes(self, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Agent codebooks [n, 8] of a pass; rows without a valid frame, or holding non-codec ids, become silence."""
        agent = tokens[:, 1 : 1 + USER_CODEBOOKS]
        ok = valid.view(-1, 1) & (agent >= 0) & (agent < self.codec.cardinality)
        return torch.where(ok, agent, self.silence.expand_as(agent))

    def _user_columns(self) -> slice:
        K = self.config.num_codebooks
        return slice(K - USER_CODEBOOKS, K)

    def _tick_every_slot_then_reset(self) -> None:
        """Warm-up's last part: the engine's own live tick over every slot, twice (index copies, host transfers,
        codec calls), then a fresh start for every slot."""
        B, K, F = self.num_slots, self.config.num_codebooks, self.codec.frame_size
        mask = torch.zeros(B, K, dtype=torch.bool)
        mask[:, self._user_columns()] = True
        rows = StepRows(list(range(B)), torch.zeros(B, K, dtype=torch.long), mask, num_live=B)
        for _ in range(2):
            self.step(rows, torch.zeros(B, F))
        for slot in range(B):
            self.reset_slot(slot)


class EagerBackend(LockstepBackend):
    """``LockstepGen`` over the whole batch (execution mask) and the eager Mimi codec over every row.

    Args:
        lm: the loaded model.
        codec: the Mimi codec on the same device.
        num_slots: batch size.
        sampling: decoding settings.
        seed: sampling RNG seed.
    """

    name = "eager"

    def __init__(self, lm: MoshiLM, codec: MimiCodec, num_slots: int, sampling: SamplingConfig, seed: int = 0):
        super().__init__(lm, codec, num_slots)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        self.gen = LockstepGen(lm, num_slots, sampling, generator)
        self.state = self.gen
        self.mimi_state = codec.init_stream(num_slots, personaplex=lm.config.personaplex)

    def warmup(self) -> None:
        self._tick_every_slot_then_reset()

    def reset_slot(self, slot: int) -> None:
        mask = _one_hot(slot, self.num_slots)
        self.gen.reset(mask.to(self.device))
        self.mimi_state.reset(mask)

    def reset_codec(self, slot: int) -> None:
        self.mimi_state.reset(_one_hot(slot, self.num_slots))

    def restore_token_cache(self, slot: int, cache: torch.Tensor) -> None:
        self.gen.restore_token_cache(slot, cache)

    @torch.no_grad()
    def step(self, rows: StepRows, pcm: torch.Tensor | None = None, frozen: Sequence[int] = ()) -> StepResult:
        B, K, dev = self.num_slots, self.config.num_codebooks, self.device
        index = torch.tensor(rows.slots, dtype=torch.long)
        live = index[: rows.num_live]
        forced = torch.zeros(B, K, dtype=torch.long)
        mask = torch.zeros(B, K, dtype=torch.bool)
        exec_mask = torch.zeros(B, dtype=torch.bool)
        forced[index], mask[index], exec_mask[index] = rows.forced, rows.forced_mask, True
        embeddings = use_embeddings = None
        if rows.embeddings is not None and rows.use_embeddings is not None:
            embeddings = torch.zeros(B, 1, self.config.dim)
            use_embeddings = torch.zeros(B, dtype=torch.bool)
            embeddings[index, 0], use_embeddings[index] = rows.embeddings.float(), rows.use_embeddings
            embeddings, use_embeddings = embeddings.to(dev, self.dtype), use_embeddings.to(dev)
        forced = forced.to(dev)
        saved = None
        if rows.num_live:
            assert pcm is not None, "live rows need their audio"
            saved = save_codec_rows(self.mimi_state, list(frozen)) if frozen else None
            frame = torch.zeros(B, 1, self.codec.frame_size)
            frame[live, 0] = pcm
            codes = self.codec.encode_step(frame.to(dev), self.mimi_state)[:, :, 0]  # [B, 8]
            live_dev = live.to(dev)
            forced[live_dev, self._user_columns()] = codes[live_dev]
        out = self.gen.step(forced, mask.to(dev), exec_mask.to(dev), embeddings, use_embeddings)
        pcm_out = None
        if rows.num_live:
            agent = self.agent_codes(out.tokens, out.valid)  # every row: idle rows decode silence
            decoded = self.codec.decode_step(agent[:, :, None], self.mimi_state, validate=False)[:, 0]
            if saved is not None:
                restore_codec_rows(self.mimi_state, saved)
            pcm_out = decoded[live.to(dev)].cpu()
        index_dev = index.to(dev)
        return StepResult(out.tokens[index_dev].cpu(), out.valid[index_dev].cpu(), pcm_out)

    def memory_snapshot(self) -> dict[str, float]:
        kv = self.gen.kv.keys.numel() * self.gen.kv.keys.element_size() * 2
        weights = sum(p.numel() * p.element_size() for p in self.lm.parameters())
        return {"lm_kv_bytes": float(kv), "lm_weight_bytes": float(weights)}


# ---- codec rows of paused slots ------------------------------------------------------------------------


def _one_hot(slot: int, size: int) -> torch.Tensor:
    mask = torch.zeros(size, dtype=torch.bool)
    mask[slot] = True
    return mask


def save_codec_rows(state, rows: list[int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Copies of the given batch rows of every per-row tensor of a Mimi stream state.

    Mimi has no execution mask, so a frozen slot's rows are saved before a batched codec call and put back
    after it (in place: a captured graph keeps using the same tensors); the slot then resumes exactly where it
    paused.
    """
    index = torch.tensor(rows, dtype=torch.long)
    saved = {p: t[index.to(t.device)].clone() for p, t in per_row_tensors(state)}
    return index, saved


def restore_codec_rows(state, saved: tuple[torch.Tensor, dict[str, torch.Tensor]]) -> None:
    index, values = saved
    tensors = dict(state_tensors(state))
    for path, value in values.items():
        target = tensors[path]
        target[index.to(target.device)] = value
