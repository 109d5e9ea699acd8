"""Feeds over any set of sessions, CUDA-graphed per shape bucket: one-token decode steps and padded runs.

``StepGraphs``: one decode step (token in -> hidden and logits out). A step of ``n`` rows runs the bucket of
``rows >= n`` rows (padding rows write to the pool's scratch slot) and of ``kv_len >= every row's position
+ 1`` (a power of two, at least ``MIN_KV``).

``RunGraphs``: runs of several positions (prompts, prefills, closes, TTS conditions), one run per row, each
padded at its end to a ``T_BUCKETS`` length (the padding writes to the scratch slot; attention is causal, so
the real positions compute what they would unpadded, up to float summation order). Only each run's last
real position comes out. Rows of different lengths share one forward; a run longer than the largest bucket
goes in chunks (causal again).

Each shape is captured once, on first use or at warm-up. On a CPU the same functions run eagerly at the
same bucketed shapes, so CPU tests exercise the code the graphs replay.

The outputs of ``StepGraphs`` are views of static buffers that the next step overwrites: copy what must
outlive a step. ``RunGraphs`` returns fresh tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from inference.models.minicpmo.fast.decoder import KVPool, RowDecoder

MIN_KV = 256
ROW_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
T_BUCKETS = (16, 32, 64, 128)  # a unit's prefill is 13-15 positions, 79-81 with a frame; a TTS condition <= 20


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


def upload(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Equal-length int lists -> one long tensor on ``device`` in one (pinned, asynchronous) copy."""
    host = torch.tensor(rows, dtype=torch.long)
    host = host.pin_memory() if device.type == "cuda" else host
    return host.to(device, non_blocking=True)


class ShapeGraphs:
    """Captured graphs by shape key, sharing one memory pool; ``_launch`` replays (CUDA) or runs (CPU)."""

    def __init__(self, pool: KVPool, max_rows: int):
        self.pool = pool
        self.row_buckets = tuple(b for b in ROW_BUCKETS if b < max_rows) + (max_rows,)
        self.kv_buckets = kv_buckets(pool.capacity)
        self.graphs: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}
        self.use_graphs = pool.keys[0].device.type == "cuda"
        self._pool_handle = torch.cuda.graph_pool_handle() if self.use_graphs else None

    def _run(self, *shape: int) -> None:
        raise NotImplementedError

    def _capture(self, *shape: int) -> torch.cuda.CUDAGraph:
        # A warm-up run on a side stream first (cuBLAS handles, lazy kernels). Warm-ups and captures run on
        # padding rows (scratch slot) or re-write the same keys at the same positions: nothing live changes.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(*shape)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool_handle):
            self._run(*shape)
        self.graphs[shape] = graph
        return graph

    def _launch(self, *shape: int) -> None:
        if self.use_graphs:
            graph = self.graphs.get(shape) or self._capture(*shape)
            graph.replay()
        else:
            self._run(*shape)


class StepGraphs(ShapeGraphs):
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
        super().__init__(pool, max_rows)
        self.decoder, self.embed, self.head = decoder, embed, head
        device = pool.keys[0].device
        self.tokens = torch.zeros(max_rows, dtype=torch.long, device=device)
        self.slots = torch.full((max_rows,), pool.scratch, dtype=torch.long, device=device)
        self.starts = torch.zeros(max_rows, dtype=torch.long, device=device)
        dim = decoder.model.norm.weight.shape[0]
        self.hidden = torch.zeros(max_rows, dim, dtype=pool.keys[0].dtype, device=device)
        self.logits = torch.zeros(max_rows, vocab, dtype=torch.float32, device=device)

    def _run(self, rows: int, kv_len: int) -> None:
        x = self.embed(self.tokens[:rows])[:, None]  # [R, 1, D]
        h = self.decoder.forward(self.pool, x, self.slots[:rows], self.starts[:rows], kv_len)[:, 0]
        self.hidden[:rows] = h
        self.logits[:rows] = self.head(h).float()

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
        self, slots: Sequence[int], tokens: Sequence[int] | torch.Tensor, starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``tokens[r]`` at ``starts[r]`` of slot ``slots[r]``; returns views (hidden [n, D], logits [n, V]).

        ``tokens`` may be a device tensor [n] (ids chosen on the device): it is copied there, never read back.
        """
        n = len(slots)
        rows = smallest_at_least(n, self.row_buckets)
        kv_len = smallest_at_least(max(starts) + 1, self.kv_buckets)
        pad = rows - n
        on_device = isinstance(tokens, torch.Tensor)
        host_tokens = [0] * rows if on_device else [*tokens, *[0] * pad]
        packed = upload([host_tokens, [*slots, *[self.pool.scratch] * pad], [*starts, *[0] * pad]], self.tokens.device)
        self.tokens[:rows].copy_(packed[0])
        if on_device:
            self.tokens[:n].copy_(tokens)
        self.slots[:rows].copy_(packed[1])
        self.starts[:rows].copy_(packed[2])
        self._launch(rows, kv_len)
        return self.hidden[:n], self.logits[:n]


class RunGraphs(ShapeGraphs):
    """Static buffers and captured graphs of padded multi-position runs: last position's (hidden, logits).

    Args:
        decoder: the row-batched decoder.
        pool: its KV pool.
        head: hidden [R, D] -> logits [R, V] (cast to float32 here).
        vocab: V.
        max_rows: the most runs one forward takes.
    """

    def __init__(
        self,
        decoder: RowDecoder,
        pool: KVPool,
        head: Callable[[torch.Tensor], torch.Tensor],
        vocab: int,
        max_rows: int,
    ):
        super().__init__(pool, max_rows)
        self.decoder, self.head = decoder, head
        device, dtype = pool.keys[0].device, pool.keys[0].dtype
        dim = decoder.model.norm.weight.shape[0]
        self.max_t = T_BUCKETS[-1]
        self.x = torch.zeros(max_rows, self.max_t, dim, dtype=dtype, device=device)  # stays finite: never NaN pads
        self.slots = torch.full((max_rows,), pool.scratch, dtype=torch.long, device=device)
        self.starts = torch.zeros(max_rows, dtype=torch.long, device=device)
        self.lengths = torch.ones(max_rows, dtype=torch.long, device=device)
        self.hidden = torch.zeros(max_rows, dim, dtype=dtype, device=device)
        self.logits = torch.zeros(max_rows, vocab, dtype=torch.float32, device=device)

    def _run(self, rows: int, T: int, kv_len: int) -> None:
        lengths = self.lengths[:rows]
        h = self.decoder.forward(self.pool, self.x[:rows, :T], self.slots[:rows], self.starts[:rows], kv_len, lengths)
        last = h[torch.arange(rows, device=h.device), lengths - 1]  # [R, D]
        self.hidden[:rows] = last
        self.logits[:rows] = self.head(last).float()

    @torch.inference_mode()
    def capture_all(self, lengths: Sequence[int], max_kv: int | None = None) -> int:
        """Capture the ``T`` buckets of ``lengths`` for every row and kv bucket up to ``max_kv`` on padding rows
        only; returns the graph count."""
        if not self.use_graphs:
            return 0
        self.slots.fill_(self.pool.scratch)
        self.starts.zero_()
        for T in sorted({smallest_at_least(n, T_BUCKETS) for n in lengths}):
            self.lengths.fill_(T)
            for kv_len in self.kv_buckets:
                if max_kv is not None and kv_len > max_kv:
                    break
                for rows in reversed(self.row_buckets):
                    if (rows, T, kv_len) not in self.graphs:
                        self._capture(rows, T, kv_len)
        torch.cuda.synchronize()
        return len(self.graphs)

    def _forward(
        self, slots: Sequence[int], runs: Sequence[torch.Tensor], starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One bucketed forward of runs of at most ``max_t`` positions: views (hidden [n, D], logits [n, V])."""
        n = len(slots)
        lengths = [int(r.shape[0]) for r in runs]
        rows = smallest_at_least(n, self.row_buckets)
        T = smallest_at_least(max(lengths), T_BUCKETS)
        kv_len = smallest_at_least(max(s + t for s, t in zip(starts, lengths, strict=True)), self.kv_buckets)
        pad = rows - n
        packed = upload(
            [[*slots, *[self.pool.scratch] * pad], [*starts, *[0] * pad], [*lengths, *[1] * pad]], self.x.device
        )
        self.slots[:rows].copy_(packed[0])
        self.starts[:rows].copy_(packed[1])
        self.lengths[:rows].copy_(packed[2])
        if n == 1:
            self.x[0, : lengths[0]].copy_(runs[0])
        else:
            self.x[:n, : max(lengths)].copy_(pad_sequence(list(runs), batch_first=True))
        self._launch(rows, T, kv_len)
        return self.hidden[:n], self.logits[:n]

    @torch.inference_mode()
    def run(
        self, slots: Sequence[int], runs: Sequence[torch.Tensor], starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``runs[r]`` ([T_r, D]) at positions ``starts[r]..`` of slot ``slots[r]``.

        Rows go in groups of one T bucket (a 13-position unit is not padded to an omni unit's 128); longer
        runs in rounds of ``max_t`` positions. Returns new tensors: hidden [n, D], float logits [n, V] of
        each run's last position.
        """
        n = len(slots)
        hidden = torch.empty(n, self.hidden.shape[1], dtype=self.hidden.dtype, device=self.hidden.device)
        logits = torch.empty(n, self.logits.shape[1], dtype=self.logits.dtype, device=self.logits.device)
        offset = 0
        while True:
            live = [r for r in range(n) if runs[r].shape[0] > offset]
            if not live:
                return hidden, logits
            groups: dict[int, list[int]] = {}
            for r in live:
                t = min(int(runs[r].shape[0]) - offset, self.max_t)
                groups.setdefault(smallest_at_least(t, T_BUCKETS), []).append(r)
            for group in groups.values():
                h, lg = self._forward(
                    [slots[r] for r in group],
                    [runs[r][offset : offset + self.max_t] for r in group],
                    [starts[r] + offset for r in group],
                )
                index = torch.tensor(group, device=h.device)
                hidden.index_copy_(0, index, h)
                logits.index_copy_(0, index, lg)
            offset += self.max_t
