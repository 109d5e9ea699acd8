"""One decode step (token in -> hidden and logits out) over any set of sessions, CUDA-graphed per shape bucket.

A step of ``n`` rows runs the bucket of ``rows >= n`` rows (padding rows write to the pool's scratch slot)
and of ``kv_len >= every row's position + 1`` (a power of two, at least ``MIN_KV``). Each (rows, kv_len)
pair is captured once, on first use or in ``capture_all`` at warm-up; all graphs share one memory pool. On
a CPU the same function runs eagerly at the same bucketed shapes, so CPU tests exercise the code the graphs
replay.

The outputs are views of static buffers that the next step overwrites: copy what must outlive a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from inference.models.minicpmo.fast.decoder import KVPool, RowDecoder

MIN_KV = 256
ROW_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def kv_buckets(capacity: int) -> tuple[int, ...]:
    """MIN_KV, 2 x MIN_KV, ... up to ``capacity`` (always included)."""
    out, b = [], MIN_KV
    while b < capacity:
        out.append(b)
        b *= 2
    return (*out, capacity)


def smallest_at_least(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


class StepGraphs:
    """Static buffers and captured graphs of ``head(decoder(embed(tokens)))`` for rows of one position.

    Args:
        decoder: the row-batched decoder.
        pool: its KV pool.
        embed: token ids [R] -> embeddings [R, D].
        head: hidden [R, D] -> logits [R, V] (cast to float32 here).
        vocab: V.
        max_rows: the most rows one step takes.
    """

    def __init__(
        self,
        decoder: RowDecoder,
        pool: KVPool,
        embed: Callable[[torch.Tensor], torch.Tensor],
        head: Callable[[torch.Tensor], torch.Tensor],
        vocab: int,
        max_rows: int,
    ):
        self.decoder, self.pool, self.embed, self.head = decoder, pool, embed, head
        device = pool.keys[0].device
        self.row_buckets = tuple(b for b in ROW_BUCKETS if b < max_rows) + (max_rows,)
        self.kv_buckets = kv_buckets(pool.capacity)
        self.tokens = torch.zeros(max_rows, dtype=torch.long, device=device)
        self.slots = torch.full((max_rows,), pool.scratch, dtype=torch.long, device=device)
        self.starts = torch.zeros(max_rows, dtype=torch.long, device=device)
        dim = decoder.model.norm.weight.shape[0]
        self.hidden = torch.zeros(max_rows, dim, dtype=pool.keys[0].dtype, device=device)
        self.logits = torch.zeros(max_rows, vocab, dtype=torch.float32, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.use_graphs = device.type == "cuda"
        self._pool_handle = torch.cuda.graph_pool_handle() if self.use_graphs else None

    def _run(self, rows: int, kv_len: int) -> None:
        x = self.embed(self.tokens[:rows])[:, None]  # [R, 1, D]
        h = self.decoder.forward(self.pool, x, self.slots[:rows], self.starts[:rows], kv_len)[:, 0]
        self.hidden[:rows] = h
        self.logits[:rows] = self.head(h).float()

    def _capture(self, rows: int, kv_len: int) -> torch.cuda.CUDAGraph:
        # A warm-up run on a side stream first (cuBLAS handles, lazy kernels); re-running a step writes the
        # same keys/values at the same positions, so doing it on live inputs changes nothing.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(rows, kv_len)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool_handle):
            self._run(rows, kv_len)
        self.graphs[(rows, kv_len)] = graph
        return graph

    @torch.inference_mode()
    def capture_all(self, max_kv: int | None = None) -> int:
        """Capture every bucket up to ``max_kv`` positions on padding rows only; returns the graph count."""
        if not self.use_graphs:
            return 0
        self.slots.fill_(self.pool.scratch)
        self.starts.zero_()
        for kv_len in self.kv_buckets:
            if max_kv is not None and kv_len > max_kv:
                break
            for rows in reversed(self.row_buckets):
                if (rows, kv_len) not in self.graphs:
                    self._capture(rows, kv_len)
        torch.cuda.synchronize()
        return len(self.graphs)

    @torch.inference_mode()
    def step(
        self, slots: Sequence[int], tokens: Sequence[int], starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``tokens[r]`` at ``starts[r]`` of slot ``slots[r]``; returns views (hidden [n, D], logits [n, V])."""
        n = len(slots)
        rows = smallest_at_least(n, self.row_buckets)
        kv_len = smallest_at_least(max(starts) + 1, self.kv_buckets)
        pad = rows - n
        host = torch.tensor(
            [[*tokens, *[0] * pad], [*slots, *[self.pool.scratch] * pad], [*starts, *[0] * pad]], dtype=torch.long
        )
        device = self.tokens.device
        host = host.pin_memory() if device.type == "cuda" else host
        packed = host.to(device, non_blocking=True)
        self.tokens[:rows].copy_(packed[0])
        self.slots[:rows].copy_(packed[1])
        self.starts[:rows].copy_(packed[2])
        if self.use_graphs:
            graph = self.graphs.get((rows, kv_len)) or self._capture(rows, kv_len)
            graph.replay()
        else:
            self._run(rows, kv_len)
        return self.hidden[:n], self.logits[:n]
