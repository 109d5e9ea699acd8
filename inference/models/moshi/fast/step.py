"""One lockstep tick over a set of slots: the token ring, forced tokens, the forward pass, sampling.

Semantics are exactly those of ``inference.models.moshi.gen.LockstepGen.step`` (the reference's token ring,
the provided mask, PersonaPlex teacher forcing, the initial-token rule, de-delayed output), with one change of
shape: state is stored per *slot* and a step runs over *rows*, ``slot_ids[r]`` naming the slot of row r. A
slot that is not in ``slot_ids`` is frozen, which is what ``exec_mask`` does in the eager path, but it costs
nothing. Rows are gathered from the slot state, stepped, and scattered back, all on the device, with no host
sync and no Python branch on tensor values, so ``run_rows`` can be captured in a CUDA graph.

Static buffers (``StepBuffers``) hold the inputs and outputs of up to ``max_rows`` rows; a bucket of b rows
uses the first b entries, padding rows pointing at the scratch slot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.models.moshi.fast import ops
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.fast.model import FastLM
from inference.models.moshi.gen import UNGENERATED, SamplingConfig


@dataclass
class StepBuffers:
    """Static per-row inputs and outputs (first dimension ``max_rows``).

    Attributes:
        slot_ids: [N] long, the slot of each row (the scratch slot for padding rows).
        forced: [N, K] long, tokens forced this tick (user codes live; everything during a prefill).
        forced_mask: [N, K] bool, which of ``forced`` apply.
        embeddings: [N, dim] input embeddings replacing the token embeddings where ``use_embeddings``.
        use_embeddings: [N] bool (voice-prompt replay).
        tokens: [N, 1 + dep_q] long out: the de-delayed frame (text, then the predicted codebooks).
        valid: [N] bool out: the row has passed the delay warm-up and ``tokens`` are real.
    """

    slot_ids: torch.Tensor
    forced: torch.Tensor
    forced_mask: torch.Tensor
    embeddings: torch.Tensor
    use_embeddings: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor

    @classmethod
    def allocate(cls, max_rows: int, num_codebooks: int, dim: int, out_rows: int, scratch: int, device, dtype):
        return cls(
            slot_ids=torch.full((max_rows,), scratch, device=device, dtype=torch.long),
            forced=torch.zeros((max_rows, num_codebooks), device=device, dtype=torch.long),
            forced_mask=torch.zeros((max_rows, num_codebooks), device=device, dtype=torch.bool),
            embeddings=torch.zeros((max_rows, dim), device=device, dtype=dtype),
            use_embeddings=torch.zeros((max_rows,), device=device, dtype=torch.bool),
            tokens=torch.zeros((max_rows, out_rows), device=device, dtype=torch.long),
            valid=torch.zeros((max_rows,), device=device, dtype=torch.bool),
        )


class FastLockstep:
    """Per-slot generation state plus the row step of the fast path.

    Args:
        fast_lm: the row-batched model.
        num_slots: sessions this instance serves (one more scratch slot is allocated).
        max_rows: the largest batch bucket.
        sampling: decoding settings (``use_sampling=False`` for greedy).
        kv_fp8: store the temporal KV rings in fp8 e4m3 (half the memory and read traffic of bf16).
        kv_page_size: ring positions per KV page; None for contiguous rings (a slot's whole window at once).
        kv_pages: physical KV pages in the pool; None for every slot's full window (the pool never runs dry).
        keep_text_logits: also keep each row's text logits of the last pass (``text_logits`` [max_rows,
            text_card] fp32), for measuring what the KV format does to the distribution; off when serving.
    """

    def __init__(
        self,
        fast_lm: FastLM,
        num_slots: int,
        max_rows: int,
        sampling: SamplingConfig | None = None,
        kv_fp8: bool = False,
        kv_page_size: int | None = None,
        kv_pages: int | None = None,
        keep_text_logits: bool = False,
    ):
        c = fast_lm.config
        self.lm = fast_lm
        self.config = c
        self.sampling = sampling or SamplingConfig()
        self.num_slots = num_slots
        self.max_rows = max_rows
        device, dtype = fast_lm.device, fast_lm.dtype
        self.device = device
        self.ct = c.max_delay + 3
        self.write_lag = 0 if c.personaplex else 1
        K = c.num_codebooks
        self.delays = torch.tensor(c.delays, device=device, dtype=torch.long)
        self.initial = torch.tensor([c.text_card] + [c.card] * c.n_q, device=device, dtype=torch.long)
        self.kv = SlotKV.allocate(c, num_slots, device, dtype, fp8=kv_fp8, page_size=kv_page_size, num_pages=kv_pages)
        self.scratch_slot = self.kv.scratch_slot
        S = num_slots + 1
        self.cache = torch.full((S, K, self.ct), UNGENERATED, device=device, dtype=torch.long)
        self.provided = torch.zeros((S, K, self.ct), device=device, dtype=torch.bool)
        self.lengths = torch.zeros((S,), device=device, dtype=torch.long)
        self.passes = [0] * S  # host mirror of ``lengths``: which KV pages each slot needs before its next pass
        self._pages_to_trash = False  # ``trash_pages``: passes take no pages (warm-up over every slot)
        self.buffers = StepBuffers.allocate(max_rows, K, c.dim, 1 + c.dep_q, self.scratch_slot, device, dtype)
        self.dep_keys, self.dep_values = fast_lm.allocate_depformer_cache(max_rows)
        self.text_logits = (
            torch.zeros((max_rows, c.text_card), device=device, dtype=torch.float32) if keep_text_logits else None
        )
        # per-row RNG counters of the fused sampler (advanced on the device by the kernel itself)
        self.seeds = torch.randint(0, 2**31 - 1, (max_rows,), device=device, dtype=torch.long)
        # RNG of the torch sampler (CPU, or CUDA without Triton): None is torch's global RNG. Leave it None under
        # CUDA graphs (a private generator is not graph-safe unless registered with the graph).
        self.generator: torch.Generator | None = None
        for slot in range(S):
            self.reset_slot(slot)

    # ---- slot lifecycle (host side, between ticks) ---------------------------------------------------

    def reset_slot(self, slot: int) -> None:
        """Start a fresh session in ``slot``, including the reference's hidden first call (column 0 initial)."""
        self._check_slot(slot, allow_scratch=True)
        self.cache[slot].fill_(UNGENERATED)
        self.cache[slot, :, 0] = self.initial
        self.provided[slot].fill_(False)
        self.provided[slot, :, 0] = True
        self.lengths[slot] = 0
        self.passes[slot] = 0
        if slot != self.scratch_slot:
            self.kv.release(slot)

    def claim_first_page(self, slot: int) -> bool:
        """Give a freshly reset ``slot`` the KV page of its first pass; False when the pool has none free."""
        self._check_slot(slot)
        self.kv.grow([slot], [1])
        return bool(self.kv.pages.held[slot])

    def set_passes(self, slots: Sequence[int], passes: Sequence[int]) -> None:
        """Declare that ``slots[i]`` has made ``passes[i]`` passes (a restored snapshot, a benchmark's aged
        sessions): the position counters move and the slot holds the pages its filled ring needs."""
        for slot in slots:
            self._check_slot(slot)
        self.kv.grow(slots, [min(n, self.kv.window) for n in passes])
        for slot, n in zip(slots, passes, strict=True):
            self.passes[slot] = n
        index = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        self.lengths[index] = torch.tensor(list(passes), dtype=torch.long, device=self.device)

    @contextlib.contextmanager
    def trash_pages(self):
        """Passes inside write the KV of slots that hold no page to the trash page instead of taking pages from
        the pool: warm-up ticks over every slot must not need a page per slot from a pool sized for fewer
        calls. The slots' state is garbage afterwards: reset them."""
        self._pages_to_trash = True
        try:
            yield
        finally:
            self._pages_to_trash = False

    def prepare_pages(self, slots: Sequence[int]) -> None:
        """Before a pass over ``slots``: each gets the page its next position is written to (host side).

        Raises:
            RuntimeError: a slot that holds no page and none is free (``claim_first_page`` at open prevents it).
        """
        if self._pages_to_trash:
            for slot in slots:
                self.passes[slot] += 1
            return
        self.kv.grow(slots, [self.passes[s] + 1 for s in slots])
        for slot in slots:
            if not self.kv.pages.held[slot]:
                raise RuntimeError(f"slot {slot} has no KV page and the pool is empty")
            self.passes[slot] += 1

    def restore_token_cache(self, slot: int, cache: torch.Tensor) -> None:
        """Overwrite the slot's token ring with a voice prompt's saved ring [K, CT]; provided flags are kept."""
        self._check_slot(slot)
        if tuple(cache.shape) != (self.config.num_codebooks, self.ct):
            raise ValueError(
                f"voice prompt cache has shape {tuple(cache.shape)}, expected {(self.config.num_codebooks, self.ct)}"
            )
        self.cache[slot].copy_(cache.to(self.cache))

    def _check_slot(self, slot: int, allow_scratch: bool = False) -> None:
        limit = self.num_slots + (1 if allow_scratch else 0)
        if not 0 <= slot < limit:
            raise ValueError(f"slot {slot} out of range 0..{self.num_slots - 1}")

    # ---- the step ----------------------------------------------------------------------------------

    @torch.no_grad()
    def run_rows(self, rows: int) -> None:
        """Step the first ``rows`` rows of ``self.buffers`` (graph-capturable: device ops only)."""
        c = self.config
        b = self.buffers
        K, CT, G = c.num_codebooks, self.ct, 1 + c.dep_q
        slot_ids = b.slot_ids[:rows]
        forced, forced_mask = b.forced[:rows], b.forced_mask[:rows]
        cache = self.cache[slot_ids]  # [R, K, CT] gathered copies
        provided = self.provided[slot_ids]
        pos = self.lengths[slot_ids]  # [R] position of this pass
        o = pos + 1  # the reference's offset
        w = o - self.write_lag
        # 1. forced tokens at column w + delay (marked provided), then the initial-token rule on column w
        cols = ((w.view(-1, 1) + self.delays.view(1, K)) % CT).unsqueeze(-1)  # [R, K, 1]
        _masked_put(cache, provided, cols, forced.unsqueeze(-1), forced_mask.unsqueeze(-1), mark=True)
        is_init = (w.view(-1, 1) <= self.delays.view(1, K)).unsqueeze(-1)
        wcol = (w % CT).view(-1, 1, 1).expand(-1, K, 1)
        _masked_put(cache, provided, wcol, self.initial.view(1, K, 1).expand(rows, K, 1), is_init, mark=True)
        # 2. the model pass on column o - 1
        read_col = ((o - 1) % CT).view(-1, 1, 1).expand(-1, K, 1)
        target_col = (o % CT).view(-1, 1, 1).expand(-1, K, 1)
        x = self.lm.embed_column(cache.gather(2, read_col)[:, :, 0])
        x = torch.where(b.use_embeddings[:rows].view(-1, 1), b.embeddings[:rows], x)
        hidden = self.lm.temporal(x, self.kv, slot_ids, pos)
        s = self.sampling
        text_logits = self.lm.text_logits(hidden)
        if self.text_logits is not None:
            self.text_logits[:rows].copy_(text_logits)
        sampled_text = ops.sample(
            text_logits, s.use_sampling, s.temp_text, s.top_k_text, self.seeds[:rows], 0, self.generator
        )
        target = cache.gather(2, target_col)[:, :, 0]  # [R, K]
        target_provided = provided.gather(2, target_col)[:, :, 0]
        text_in = torch.where(target_provided[:, 0], target[:, 0], sampled_text)
        audio = self._depformer(hidden, text_in, target[:, 1:], target_provided[:, 1:], rows)
        # 3. write back: clear the flags of the column just read; fill column o where not provided
        provided.scatter_(2, read_col, torch.zeros_like(read_col, dtype=torch.bool))
        new = torch.cat([sampled_text[:, None], audio], dim=1)  # [R, G]
        fill = ~target_provided[:, :G]
        head_cache = cache[:, :G]
        old = head_cache.gather(2, target_col[:, :G])
        head_cache.scatter_(2, target_col[:, :G], torch.where(fill.unsqueeze(-1), new.unsqueeze(-1), old))
        # 4. the de-delayed frame o - 1
        out_cols = ((o.view(-1, 1) - c.max_delay + self.delays[:G].view(1, G)) % CT).unsqueeze(-1)
        tokens = cache[:, :G].gather(2, out_cols)[:, :, 0]
        valid = o > c.max_delay
        b.tokens[:rows].copy_(torch.where(valid.view(-1, 1), tokens, torch.full_like(tokens, UNGENERATED)))
        b.valid[:rows].copy_(valid)
        # 5. scatter the rows back into their slots
        self.cache[slot_ids] = cache
        self.provided[slot_ids] = provided
        self.lengths[slot_ids] = o

    def _depformer(self, hidden, text_token, forced_audio, forced_audio_mask, rows: int) -> torch.Tensor:
        s = self.sampling
        dep_in = self.lm.depformer_inputs(hidden)  # [R, dep_q, dd]
        keys = [k[:rows] for k in self.dep_keys]
        values = [v[:rows] for v in self.dep_values]
        prev = text_token
        out = []
        for k in range(self.config.dep_q):
            logits = self.lm.depformer_step(k, dep_in[:, k], prev, keys, values)
            token = ops.sample(logits, s.use_sampling, s.temp, s.top_k, self.seeds[:rows], k + 1, self.generator)
            out.append(token)
            prev = torch.where(forced_audio_mask[:, k], forced_audio[:, k], token)
        return torch.stack(out, dim=1)

    # ---- eager convenience -----------------------------------------------------------------------------

    def load_rows(
        self,
        slot_ids: torch.Tensor,
        forced: torch.Tensor,
        forced_mask: torch.Tensor,
        embeddings: torch.Tensor | None = None,
        use_embeddings: torch.Tensor | None = None,
        pad_to: int | None = None,
        slots: Sequence[int] | None = None,
    ) -> int:
        """Copy one tick's inputs for n rows into the static buffers; rows n..pad_to-1 become padding.

        ``slots`` is ``slot_ids`` as a host list when the caller has one (no device read to find the pages).
        """
        n = slot_ids.shape[0]
        rows = pad_to or n
        if not 0 < n <= rows <= self.max_rows:
            raise ValueError(f"{n} rows do not fit a bucket of {rows} (max {self.max_rows})")
        K = self.config.num_codebooks
        if tuple(forced.shape) != (n, K) or tuple(forced_mask.shape) != (n, K):
            raise ValueError(
                f"forced and forced_mask must be [{n}, {K}], got {tuple(forced.shape)}, {tuple(forced_mask.shape)}"
            )
        if not slot_ids.is_cuda:  # host inputs are checked here; a bad index inside a graph would kill the context
            self._check_host_rows(slot_ids, forced, forced_mask)
        self.prepare_pages(slots if slots is not None else slot_ids.tolist())
        b = self.buffers
        b.slot_ids[:n].copy_(slot_ids, non_blocking=True)
        b.slot_ids[n:rows].fill_(self.scratch_slot)
        b.forced[:n].copy_(forced, non_blocking=True)
        b.forced_mask[:n].copy_(forced_mask, non_blocking=True)
        b.forced_mask[n:rows].fill_(False)
        if embeddings is not None and use_embeddings is not None:
            b.embeddings[:n].copy_(embeddings, non_blocking=True)
            b.use_embeddings[:n].copy_(use_embeddings, non_blocking=True)
            b.use_embeddings[n:rows].fill_(False)
        else:
            b.use_embeddings[:rows].fill_(False)
        return rows

    def _check_host_rows(self, slot_ids: torch.Tensor, forced: torch.Tensor, forced_mask: torch.Tensor) -> None:
        c = self.config
        ids = slot_ids.tolist()
        if any(not 0 <= s < self.num_slots for s in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"slot ids must be distinct and in 0..{self.num_slots - 1}, got {ids}")
        limit = torch.tensor([c.text_card] + [c.card] * c.n_q).view(1, -1)
        bad = forced_mask.cpu() & ((forced.cpu() < 0) | (forced.cpu() > limit))
        if bool(bad.any()):
            raise ValueError("forced tokens out of range (text 0..text_card, audio 0..card)")

    def step_eager(self, slot_ids, forced, forced_mask, embeddings=None, use_embeddings=None):
        """Run one tick without graphs; returns (tokens [n, 1 + dep_q], valid [n]) views of the buffers."""
        n = slot_ids.shape[0]
        self.load_rows(slot_ids, forced, forced_mask, embeddings, use_embeddings)
        self.run_rows(n)
        return self.buffers.tokens[:n], self.buffers.valid[:n]


def _masked_put(cache, provided, cols, values, mask, mark: bool) -> None:
    """cache.scatter at ``cols`` [R, K, 1] where ``mask``; forced/initial writes also set the provided flag."""
    old = cache.gather(2, cols)
    cache.scatter_(2, cols, torch.where(mask, values, old))
    if mark:
        provided.scatter_(2, cols, provided.gather(2, cols) | mask)
