"""Batched Mimi encode and decode over a prefix of the slots, each captured once per prefix as a CUDA graph.

The native codec (``inference.models.moshi.mimi``) is launch-bound: eager, one frame costs about 18 ms to
encode and 16 ms to decode on an H200 whatever the batch, which alone would break the 80 ms tick at 128
sessions. Its streaming state is updated in place, so a whole encode step and a whole decode step can each
be captured. A slot's row holds its own stream state and live slots are written in by ``slot_ids``.

Graphed, the cost follows the rows: on one H100 encode + decode over all 320 rows took 19 ms of a 50 ms tick
whatever the calls (``bench/serving_gpu_service.py --tick-split-log``). So each step is captured once per prefix
size (``PREFIXES``, and ``num_slots``) over views of the first rows of the state, and a tick replays the
smallest prefix that holds its highest live slot: the pool hands out the lowest free slot, so the live slots
stay near the front. Rows past the prefix do not move (no live slot is there); idle rows inside it recompute
stale input, and a joining slot resets its row.
"""

from __future__ import annotations

import copy
from bisect import bisect_left

import torch

from inference.models.moshi.mimi import MimiCodec, MimiStreamState

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

    def prefix_for(self, highest_slot: int | None) -> int:
        """The fewest rows a step may run over to reach ``highest_slot`` (None: every row)."""
        if highest_slot is None:
            return self.num_slots
        return self.prefixes[bisect_left(self.prefixes, highest_slot + 1)]

    def reset_slot(self, slot: int) -> None:
        """A new session in ``slot``: fresh encoder and decoder streams for that row only."""
        mask = torch.zeros(self.num_slots, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.state.reset(mask)

    @torch.no_grad()
    def encode(self, pcm: torch.Tensor, slot_ids: torch.Tensor, highest_slot: int | None = None) -> torch.Tensor:
        """pcm [n, 1, frame] of the slots ``slot_ids`` [n] -> codes [n, K] (a view, valid until the next call).

        ``highest_slot``: the largest of ``slot_ids`` if the caller knows it on the host (the step then runs
        over the prefix that holds it); None runs every row."""
        rows = self.prefix_for(highest_slot)
        self.pcm_in[slot_ids] = pcm.to(self.pcm_in.dtype)
        graph = self._encode_graphs.get(rows)
        if graph is None:
            self.codes_out[rows] = self.codec.encode_step(self.pcm_in[:rows], self._states[rows])
        else:
            graph.replay()
        return self.codes_out[rows][slot_ids, :, 0]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, slot_ids: torch.Tensor, highest_slot: int | None = None) -> torch.Tensor:
        """codes [n, K] (in range) of the slots ``slot_ids`` -> pcm [n, 1, frame]; ``highest_slot`` as in
        ``encode``."""
        rows = self.prefix_for(highest_slot)
        self.codes_in[slot_ids, :, 0] = codes
        graph = self._decode_graphs.get(rows)
        if graph is None:
            self.pcm_out[rows] = self.codec.decode_step(self.codes_in[:rows], self._states[rows], validate=False)
        else:
            graph.replay()
        return self.pcm_out[rows][slot_ids]
