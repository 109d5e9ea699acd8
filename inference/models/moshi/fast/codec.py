"""Batched Mimi encode and decode over every slot, each captured once as a CUDA graph.

The native codec (``inference.models.moshi.mimi``) is launch-bound: eager, one frame costs about 18 ms to
encode and 16 ms to decode on an H200 whatever the batch, which alone would break the 80 ms tick at 128
sessions. Its streaming state is updated in place, so a whole encode step and a whole decode step can each
be captured. The captured batch is all ``num_slots`` rows: a slot's row holds its own stream state, live
slots are written in by ``slot_ids``, idle rows just recompute stale input (the cost is flat in the batch),
and a joining slot resets its row.
"""

from __future__ import annotations

import torch

from inference.models.moshi.mimi import MimiCodec


class GraphedMimi:
    """Mimi streams for ``num_slots`` slots with graphed ``encode`` and ``decode`` (eager on CPU).

    Args:
        codec: the codec (eval mode, on its device).
        num_slots: rows of the captured batch; slot ids index them.
        personaplex: the NVIDIA/personaplex fork's attention window (``MimiCodec.init_stream``).
    """

    def __init__(self, codec: MimiCodec, num_slots: int, *, personaplex: bool = False):
        self.codec = codec
        self.num_slots = num_slots
        param = next(codec.parameters())
        self.device = param.device
        self.frame = codec.frame_size
        self.state = codec.init_stream(num_slots, personaplex=personaplex)
        self.pcm_in = torch.zeros((num_slots, 1, self.frame), device=self.device, dtype=param.dtype)
        self.codes_in = torch.zeros((num_slots, codec.num_codebooks, 1), device=self.device, dtype=torch.long)
        self.codes_out: torch.Tensor | None = None
        self.pcm_out: torch.Tensor | None = None
        self._encode_graph: torch.cuda.CUDAGraph | None = None
        self._decode_graph: torch.cuda.CUDAGraph | None = None

    @torch.no_grad()
    def capture(self) -> None:
        """Warm up (cuDNN algorithm choice) and capture both steps; the streams start fresh afterwards."""
        if self.device.type != "cuda":
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.codec.encode_step(self.pcm_in, self.state)
                self.codec.decode_step(self.codes_in, self.state, validate=False)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self._encode_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._encode_graph):
            self.codes_out = self.codec.encode_step(self.pcm_in, self.state)
        self._decode_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._decode_graph):
            self.pcm_out = self.codec.decode_step(self.codes_in, self.state, validate=False)
        torch.cuda.synchronize()
        self.state.reset()

    def reset_slot(self, slot: int) -> None:
        """A new session in ``slot``: fresh encoder and decoder streams for that row only."""
        mask = torch.zeros(self.num_slots, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.state.reset(mask)

    @torch.no_grad()
    def encode(self, pcm: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
        """pcm [n, 1, frame] of the slots ``slot_ids`` [n] -> codes [n, K] (a view, valid until the next call)."""
        self.pcm_in[slot_ids] = pcm.to(self.pcm_in.dtype)
        if self._encode_graph is None:
            self.codes_out = self.codec.encode_step(self.pcm_in, self.state)
        else:
            self._encode_graph.replay()
        return self.codes_out[slot_ids, :, 0]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
        """codes [n, K] (in range) of the slots ``slot_ids`` -> pcm [n, 1, frame]."""
        self.codes_in[slot_ids, :, 0] = codes
        if self._decode_graph is None:
            self.pcm_out = self.codec.decode_step(self.codes_in, self.state, validate=False)
        else:
            self._decode_graph.replay()
        return self.pcm_out[slot_ids]
