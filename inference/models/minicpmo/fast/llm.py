"""The MiniCPM-o LLM over a static KV pool: ``DuplexLLM``'s interface plus a batched, graphed decode step.

A session's cache is a ``SlotCache``: a slot of the pool and its length. The slot goes back to the pool
when the handle is garbage-collected, so dropping a session frees its place exactly as dropping a
``DynamicCache`` frees its tensors (the engine's close_slot relies on that). Multi-position feeds (prompt,
prefill, finalize) of any number of sessions go through ``RunGraphs`` (padded to a length bucket); one-token
feeds through ``StepGraphs``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from inference.models.minicpmo.fast.decoder import KVPool, RowDecoder
from inference.models.minicpmo.fast.graphs import RunGraphs, StepGraphs
from inference.models.minicpmo.llm import DuplexLLM


class SlotCache:
    """One session's place in the LLM KV pool (``slot``) and the positions it holds (``length``)."""

    def __init__(self, pool: KVPool):
        self.slot = pool.acquire()
        self.length = 0
        self._release = weakref.finalize(self, pool.release, self.slot)

    def get_seq_length(self) -> int:
        return self.length


class FastLLM:
    """Static-cache LLM sharing the weights of a loaded ``DuplexLLM``.

    Args:
        llm: the loaded LLM (its modules are used as they are).
        num_slots: sessions served at once.
        capacity: LLM positions per session (the sliding window keeps a call under it).
        max_rows: the most sessions one decode step takes.
        invariant: reduce through the row-invariant kernels (CUDA; see ``RowDecoder``).
    """

    def __init__(
        self,
        llm: DuplexLLM,
        *,
        num_slots: int,
        capacity: int,
        max_rows: int,
        invariant: bool = False,
    ):
        self.llm = llm.llm  # the HF Qwen3ForCausalLM (DuplexRunner reads its dtype)
        self.hidden_size = llm.hidden_size
        self.decoder = RowDecoder(self.llm.model, invariant=invariant)
        self.pool = self.decoder.new_pool(num_slots, capacity)
        self.capacity = capacity
        self.graphs = StepGraphs(
            self.decoder,
            self.pool,
            embed=self.llm.model.embed_tokens,
            head=self.llm.lm_head,
            vocab=self.llm.lm_head.out_features,
            max_rows=max_rows,
        )
        self.runs = RunGraphs(
            self.decoder, self.pool, head=self.llm.lm_head, vocab=self.llm.lm_head.out_features, max_rows=max_rows
        )

    def new_cache(self) -> SlotCache:
        return SlotCache(self.pool)

    @staticmethod
    def cache_length(cache: SlotCache) -> int:
        return cache.length

    def embed_ids(self, ids: list[int]) -> torch.Tensor:
        table = self.llm.model.embed_tokens.weight
        return table[torch.tensor(ids, dtype=torch.long, device=table.device)]

    def _check_room(self, cache: SlotCache, count: int) -> None:
        if cache.length + count > self.capacity:
            raise RuntimeError(f"LLM cache full: {cache.length} + {count} > {self.capacity} positions")

    @torch.inference_mode()
    def feed(self, cache: SlotCache, embeds: torch.Tensor) -> torch.Tensor:
        """Run embeddings [T, D] at the next positions; returns the final-normed hidden of the last one [1, D].

        (``DuplexLLM.feed`` returns all T rows; every caller reads only ``[-1]``.)
        """
        return self.feed_many([cache], [embeds])[0]

    @torch.inference_mode()
    def feed_many(self, caches: Sequence[SlotCache], runs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``runs[r]`` ([T_r, D]) at the next positions of ``caches[r]`` in padded, graphed forwards.

        Returns the last position's final-normed hidden [R, D] and float logits [R, V] of each run.
        """
        for cache, run in zip(caches, runs, strict=True):
            self._check_room(cache, run.shape[0])
        hidden, logits = self.runs.run([c.slot for c in caches], runs, [c.length for c in caches])
        for cache, run in zip(caches, runs, strict=True):
            cache.length += run.shape[0]
        return hidden, logits

    @torch.inference_mode()
    def feed_tokens(self, caches: Sequence[SlotCache], tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One token for each of several sessions in one step: (hidden [n, D], float logits [n, V]) views."""
        for cache in caches:
            self._check_room(cache, 1)
        hidden, logits = self.graphs.step([c.slot for c in caches], tokens, [c.length for c in caches])
        for cache in caches:
            cache.length += 1
        return hidden, logits

    @torch.inference_mode()
    def step_ahead(self, caches: Sequence[SlotCache], tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed device ids [n] at the next position of each cache *without* counting them: the caller keeps a
        row with ``accept_ahead`` once it knows the id was the right one. Returns new (hidden, logits) tensors.

        A row never kept holds keys past its cache's length: the next feed there overwrites them, and no query
        attends past its own position, so they are never read.
        """
        hidden, logits = self.graphs.step([c.slot for c in caches], tokens, [c.length for c in caches])
        return hidden.clone(), logits.clone()

    @staticmethod
    def accept_ahead(cache: SlotCache) -> None:
        cache.length += 1

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.llm.lm_head(hidden).float()

    @torch.inference_mode()
    def drop_span(self, cache: SlotCache, start: int, count: int) -> None:
        """Remove positions [start, start + count), re-positioning the keys after them (see ``KVPool``)."""
        if count <= 0:
            return
        self.pool.shift_left(cache.slot, start, count, cache.length, self.llm.model.rotary_emb)
        cache.length -= count
