"""Batched Mimi encode and decode over a prefix of the slots, each captured once per prefix as a CUDA graph.

The native codec (``inference.models.moshi.mimi``) is launch-bound: eager, one frame costs about 18 ms to
encode and 16 ms to decode on an H200 whatever the batch, which alone would break the 80 ms tick at 128
sessions. Its streaming state is updated in place, so a whole encode step and a whole decode step can each
be captured. A slot's row holds its own stream state and live slots are written in by ``slot_ids``.

Graphed, the cost follows the rows: on one H100 encode + decode over all 320 rows took 19 ms of a 50 ms tick
whatever the calls (``bench/serving_gpu_service.py --tick-split-log``). So each step is captured once per prefix
size (``PREFIXES``, and ``num_slots``) over views of the first rows of the state, and a tick replays the
smallest prefix that holds its highest live row. Rows past the prefix do not move (no live slot is there); idle
rows inside it recompute stale input, and a joining slot resets its row.

Each slot has a row of its own (``row_of``), not always the row of its number. The pool hands out the lowest free
slot, but a call keeps its slot for minutes: after a ramp to 229 calls that admission then held near 130, the
calls left on the high slots kept the prefix at 256 rows to the end of a 5-minute run (14.9 ms of Mimi a tick at
~130 calls on the H200, bench/notes/serving-e2e.md). ``compact`` moves the call on the highest row to the lowest
row no open slot holds (one row's state copied on the device) whenever the open slots would fit a smaller
prefix, one call a tick, so the prefix follows the number of calls rather than their history.
"""

from __future__ import annotations

import copy
from bisect import bisect_left
from collections.abc import Collection, Sequence

import torch

from inference.models.moshi.mimi import MimiCodec, MimiStreamState, per_row_tensors

PREFIXES = (16, 32, 64, 96, 128, 160, 192, 256)


def rows_prefix(state: MimiStreamState, rows: int) -> MimiStreamState:
    """A state over the first ``rows`` rows of ``state``: every per-row tensor a view of its first rows, so a
    step on it updates those rows of ``state`` in place (the state is plain objects, lists and tensors)."""
    full = state.batch_size

    def view(obj):
        if isinstance(obj, torch.Tensor):
            return obj[:rows] if obj.dim() and obj.shape[0] == full else obj
        if isinstance(obj, list | tuple):
            return type(obj)(view(item) for item in obj)
        if hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
            clone = copy.copy(obj)
            for name, value in vars(obj).items():
                setattr(clone, name, view(value))
            return clone
        return obj

    prefix = view(state)
    prefix.batch_size = rows
    return prefix


class GraphedMimi:
    """Mimi streams for ``num_slots`` slots with graphed ``encode`` and ``decode`` (eager on CPU).

    Args:
        codec: the codec (eval mode, on its device).
        num_slots: rows of the state; slot ids index them.
        personaplex: the NVIDIA/personaplex fork's attention window (``MimiCodec.init_stream``).
        prefixes: row counts a step may run over (``num_slots`` is always one).
    """

    def __init__(
        self, codec: MimiCodec, num_slots: int, *, personaplex: bool = False, prefixes: tuple[int, ...] = PREFIXES
    ):
        self.codec = codec
        self.num_slots = num_slots
        param = next(codec.parameters())
        self.device = param.device
        self.frame = codec.frame_size
        self.state = codec.init_stream(num_slots, personaplex=personaplex)
        self.pcm_in = torch.zeros((num_slots, 1, self.frame), device=self.device, dtype=param.dtype)
        self.codes_in = torch.zeros((num_slots, codec.num_codebooks, 1), device=self.device, dtype=torch.long)
        self.prefixes = tuple(sorted({p for p in prefixes if 1 <= p < num_slots} | {num_slots}))
        self._states = {rows: rows_prefix(self.state, rows) for rows in self.prefixes}
        self.codes_out: dict[int, torch.Tensor] = {}  # by prefix: each graph's own output
        self.pcm_out: dict[int, torch.Tensor] = {}
        self._encode_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._decode_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.row_of = list(range(num_slots))  # slot -> its row of the stream state
        self.slot_at = list(range(num_slots))  # row -> the slot it belongs to
        self.moves = 0  # calls moved to a lower row (``compact``)

    @property
    def graphed(self) -> bool:
        return bool(self._encode_graphs) and bool(self._decode_graphs)

    @torch.no_grad()
    def capture(self) -> None:
        """Warm up (cuDNN algorithm choice) and capture both steps for every prefix, largest first into one
        memory pool (one step replays at a time, and each graph's output stays its own); the streams start
        fresh afterwards."""
        if self.device.type != "cuda":
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for rows in sorted(self.prefixes, reverse=True):
                for _ in range(2):
                    self.codec.encode_step(self.pcm_in[:rows], self._states[rows])
                    self.codec.decode_step(self.codes_in[:rows], self._states[rows], validate=False)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        for rows in sorted(self.prefixes, reverse=True):
            state = self._states[rows]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.codes_out[rows] = self.codec.encode_step(self.pcm_in[:rows], state)
            self._encode_graphs[rows] = graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.pcm_out[rows] = self.codec.decode_step(self.codes_in[:rows], state, validate=False)
            self._decode_graphs[rows] = graph
        torch.cuda.synchronize()
        self.state.reset()

    def prefix_for(self, highest_row: int | None) -> int:
        """The fewest rows a step may run over to reach ``highest_row`` (None: every row)."""
        if highest_row is None:
            return self.num_slots
        return self.prefixes[bisect_left(self.prefixes, highest_row + 1)]

    def rows_of(self, slots: Sequence[int]) -> tuple[torch.Tensor, int]:
        """The rows of ``slots`` on the device, and the highest of them (for ``encode`` and ``decode``)."""
        rows = [self.row_of[s] for s in slots]
        return torch.tensor(rows, dtype=torch.long).to(self.device), max(rows)

    def reset_slot(self, slot: int) -> None:
        """A new session in ``slot``: fresh encoder and decoder streams for its row only."""
        mask = torch.zeros(self.num_slots, dtype=torch.bool, device=self.device)
        mask[self.row_of[slot]] = True
        self.state.reset(mask)

    @torch.no_grad()
    def compact(self, open_slots: Collection[int]) -> bool:
        """Between steps: when the ``open_slots`` would fit a smaller prefix than their highest row needs, move the
        slot on that row to the lowest row no open slot holds (its streams copied there; the row it leaves goes
        to the idle slot that held the lower one). True when a slot moved."""
        if not open_slots:
            return False
        held = {self.row_of[s] for s in open_slots}
        top = max(held)
        if self.prefix_for(top) == self.prefix_for(len(held) - 1):
            return False  # as compact as the prefixes can tell
        low = next(row for row in range(top) if row not in held)
        for _, tensor in per_row_tensors(self.state):
            tensor[low].copy_(tensor[top])
        moving, idle = self.slot_at[top], self.slot_at[low]
        self.row_of[moving], self.row_of[idle] = low, top
        self.slot_at[low], self.slot_at[top] = moving, idle
        self.moves += 1
        return True

    @torch.no_grad()
    def encode(self, pcm: torch.Tensor, rows: torch.Tensor, highest_row: int | None = None) -> torch.Tensor:
        """pcm [n, 1, frame] of the streams in ``rows`` [n] -> codes [n, K] (a view, valid until the next call).

        ``rows``: the slots' rows (``rows_of``); ``highest_row``: the largest of them if the caller knows it on the
        host (the step then runs over the prefix that holds it); None runs every row."""
        prefix = self.prefix_for(highest_row)
        self.pcm_in[rows] = pcm.to(self.pcm_in.dtype)
        graph = self._encode_graphs.get(prefix)
        if graph is None:
            self.codes_out[prefix] = self.codec.encode_step(self.pcm_in[:prefix], self._states[prefix])
        else:
            graph.replay()
        return self.codes_out[prefix][rows, :, 0]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, rows: torch.Tensor, highest_row: int | None = None) -> torch.Tensor:
        """codes [n, K] (in range) of the streams in ``rows`` -> pcm [n, 1, frame]; ``rows`` and ``highest_row`` as
        in ``encode``."""
        prefix = self.prefix_for(highest_row)
        self.codes_in[rows, :, 0] = codes
        graph = self._decode_graphs.get(prefix)
        if graph is None:
            self.pcm_out[prefix] = self.codec.decode_step(self.codes_in[:prefix], self._states[prefix], validate=False)
        else:
            graph.replay()
        return self.pcm_out[prefix][rows]
