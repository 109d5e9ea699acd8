"""CUDA graphs of the fast step, one per batch-size bucket, all captured at warm-up.

A tick over n slots replays the graph of the smallest bucket >= n; rows n..bucket-1 are padding rows that
point at the scratch slot. Because the slot of each row is data (``StepBuffers.slot_ids``), not shape, a
session joining or leaving never needs a new capture, and a prefill burst for one joining slot can replay the
bucket-1 graph between live ticks.

The buckets share one memory pool and are captured from the largest down (the smaller graphs fit in the
larger one's pool), so the activation memory of all buckets together is about that of the largest.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inference.models.moshi.fast.step import FastLockstep

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 256, 320)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds n rows.

    Raises:
        ValueError: n < 1 or n larger than every bucket.
    """
    if n < 1:
        raise ValueError(f"a tick needs at least one row, got {n}")
    for b in sorted(buckets):
        if b >= n:
            return b
    raise ValueError(f"{n} rows exceed the largest bucket {max(buckets)}")


class GraphedLockstep:
    """Replays captured graphs of ``FastLockstep.run_rows``; falls back to eager on CPU.

    Args:
        lockstep: the per-slot state and row step.
        buckets: batch sizes to capture; those above ``lockstep.max_rows`` are dropped.
    """

    def __init__(self, lockstep: FastLockstep, buckets: Sequence[int] = DEFAULT_BUCKETS):
        self.lockstep = lockstep
        self.buckets = tuple(sorted({b for b in buckets if 1 <= b <= lockstep.max_rows} | {lockstep.max_rows}))
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.enabled = lockstep.device.type == "cuda"

    @torch.no_grad()
    def capture(self, warmup_runs: int = 2) -> None:
        """Capture every bucket (largest first) on padding rows only: no real slot is touched."""
        if not self.enabled:
            return
        ls = self.lockstep
        b = ls.buffers
        b.slot_ids.fill_(ls.scratch_slot)
        b.forced_mask.fill_(False)
        b.use_embeddings.fill_(False)
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # first runs compile the Triton kernels and warm cuBLAS
            for rows in sorted(self.buckets, reverse=True):
                for _ in range(warmup_runs):
                    ls.run_rows(rows)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        for rows in sorted(self.buckets, reverse=True):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                ls.run_rows(rows)
            self.graphs[rows] = graph
        torch.cuda.synchronize()
        ls.reset_slot(ls.scratch_slot)

    def step(
        self,
        slot_ids: torch.Tensor,
        forced: torch.Tensor,
        forced_mask: torch.Tensor,
        embeddings: torch.Tensor | None = None,
        use_embeddings: torch.Tensor | None = None,
        slots: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One tick for the n slots in ``slot_ids`` (``slots``: the same as a host list, if the caller has it);
        returns (tokens [n, 1 + dep_q], valid [n]) buffer views.

        The views are overwritten by the next tick: copy them (``.clone()`` or ``.cpu()``) before stepping again.
        """
        ls = self.lockstep
        n = slot_ids.shape[0]
        rows = bucket_for(n, self.buckets)
        ls.load_rows(slot_ids, forced, forced_mask, embeddings, use_embeddings, pad_to=rows, slots=slots)
        graph = self.graphs.get(rows)
        if graph is None:  # CPU, or not captured yet: the same function, eagerly
            ls.run_rows(rows)
        else:
            graph.replay()
        return ls.buffers.tokens[:n], ls.buffers.valid[:n]
