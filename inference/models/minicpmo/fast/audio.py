"""The streaming Whisper encoder over a static cache: one forward (a CUDA graph) for a tick's audio units.

The eager encoder (``StreamingAudioInput.embed_unit``) grows each session's cache by concatenation, a new
shape every unit. Here every session owns a slot of a preallocated cache (``[slot, heads, 1500, hd]`` per
layer) and a length; a unit is always 50 stem frames, so the units of any number of sessions go through one
row-batched forward: row ``r`` writes its keys at ``length_r ..`` and attends, unmasked as the eager
encoder does, to its slot's first ``length_r + 50`` frames (the rest of the ``kv_len`` bucket is masked).
The host half (mel, conv stem, trim, the reset before the learned positions run out) is the eager code.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from inference.models.minicpmo.audio_encoder import AudioStreamState, StreamingAudioInput
from inference.models.minicpmo.fast.decoder import KVPool
from inference.models.minicpmo.fast.graphs import ShapeGraphs, smallest_at_least, upload

UNIT_FRAMES = 50  # encoder frames per unit, after the trim
KV_BUCKETS = (256, 512, 1024, 1500)


@dataclass(eq=False)
class FastAudioState(AudioStreamState):
    """``AudioStreamState`` whose encoder cache is a slot of the static pool (``kv`` stays None)."""

    slot: int = -1
    length: int = 0  # encoder frames in the slot

    @property
    def cached_frames(self) -> int:
        return self.length


class FastAudio(ShapeGraphs):
    """Batched, graphed encoder + projector + pooling for up to ``max_rows`` sessions' units at once.

    Args:
        audio: the loaded ``StreamingAudioInput`` (its modules are used as they are).
        num_slots: sessions served at once.
        max_rows: the most units one forward takes.
        invariant: attend through the row-invariant kernel (CUDA), as the eager encoder does once
            ``use_row_invariant_kernels`` swapped it in; its projections and norms are the modules' own.
    """

    def __init__(self, audio: StreamingAudioInput, *, num_slots: int, max_rows: int, invariant: bool = False):
        self.audio, self.apm = audio, audio.apm
        self.invariant = invariant
        if invariant:
            from inference.models.minicpmo.invariant import kernels  # Triton: imported only where it runs

            self._attention = kernels.attention
        attn = self.apm.layers[0].self_attn
        weight = self.apm.conv1.weight
        device, dtype = weight.device, weight.dtype
        capacity = self.apm.embed_positions.num_embeddings
        pool = KVPool(
            layers=len(self.apm.layers),
            kv_heads=attn.heads,
            head_dim=attn.head_dim,
            num_slots=num_slots,
            capacity=capacity,
            device=device,
            dtype=dtype,
        )
        super().__init__(pool, max_rows)
        self.kv_buckets = tuple(b for b in KV_BUCKETS if b < capacity) + (capacity,)
        d = self.apm.layer_norm.weight.shape[0]
        llm_dim = audio.audio_projection_layer.linear2.out_features
        self.x = torch.zeros(max_rows, UNIT_FRAMES, d, dtype=dtype, device=device)
        self.slots = torch.full((max_rows,), pool.scratch, dtype=torch.long, device=device)
        self.starts = torch.zeros(max_rows, dtype=torch.long, device=device)
        self.out = torch.zeros(max_rows, UNIT_FRAMES // audio.pool_step, llm_dim, dtype=dtype, device=device)

    def new_state(self) -> FastAudioState:
        state = FastAudioState(slot=self.pool.acquire())
        weakref.finalize(state, self.pool.release, state.slot)
        return state

    def _run(self, rows: int, kv_len: int) -> None:
        x, slots, starts = self.x[:rows], self.slots[:rows], self.starts[:rows]
        R, T, D = x.shape
        positions = starts[:, None] + torch.arange(T, device=x.device)  # [R, T]
        x = x + self.apm.embed_positions.weight[positions]
        visible = torch.arange(kv_len, device=x.device)[None, :] < (starts + T)[:, None]  # [R, L]
        mask = visible[:, None, None, :]  # [R, 1, 1, L]: every new frame sees the whole cache and unit
        slot_rows = slots[:, None].expand(R, T)
        for i, layer in enumerate(self.apm.layers):
            attn = layer.self_attn
            y = layer.self_attn_layer_norm(x)
            q = attn.q_proj(y).view(R, T, attn.heads, attn.head_dim).transpose(1, 2)  # [R, H, T, hd]
            k = attn.k_proj(y).view(R, T, attn.heads, attn.head_dim)
            v = attn.v_proj(y).view(R, T, attn.heads, attn.head_dim)
            keys, values = self.pool.keys[i], self.pool.values[i]
            keys[slot_rows, :, positions] = k  # [R, T, H, hd] into [S, H, C, hd]
            values[slot_rows, :, positions] = v
            if self.invariant:  # every frame sees its slot's first start + T keys, as the eager encoder's do
                out = self._attention(q, keys, values, slots, starts, kv_len, attn.head_dim**-0.5, causal=False)
            else:
                ks, vs = keys[slots, :, :kv_len], values[slots, :, :kv_len]  # [R, H, L, hd]
                out = F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask).transpose(1, 2)
            x = x + attn.out_proj(out.reshape(R, T, D))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
        states = self.apm.layer_norm(x)
        emb = self.audio.audio_projection_layer(states)  # [R, T, llm]
        step = self.audio.pool_step
        self.out[:rows] = F.avg_pool1d(emb.transpose(1, 2), step, step).transpose(1, 2)

    @torch.inference_mode()
    def capture_all(self) -> int:
        """Capture every (rows, kv_len) bucket on padding rows only; returns the graph count."""
        if not self.use_graphs:
            return 0
        self.slots.fill_(self.pool.scratch)
        self.starts.zero_()
        for kv_len in self.kv_buckets:
            for rows in reversed(self.row_buckets):
                if (rows, kv_len) not in self.graphs:
                    self._capture(rows, kv_len)
        torch.cuda.synchronize()
        return len(self.graphs)

    @torch.inference_mode()
    def embed_units(self, states: Sequence[FastAudioState], samples: Sequence[np.ndarray]) -> torch.Tensor:
        """``embed_unit`` for several sessions: LLM embeddings [n, 10, llm_dim] (a new tensor)."""
        n = len(states)
        starts, groups = [], {True: [], False: []}  # first units / later units: one stem each
        mels = []
        for r, (state, unit) in enumerate(zip(states, samples, strict=True)):
            mel, reset = self.audio.unit_mel(state, np.asarray(unit, dtype=np.float32))
            if reset:
                state.length = 0
            groups[state.units == 0].append(r)
            mels.append(mel)
            starts.append(state.length)
            state.length += UNIT_FRAMES
            state.units += 1
        for first, group in groups.items():
            if group:
                x = self.audio.unit_stem(torch.stack([mels[r] for r in group]), first=first)  # [k, 50, d]
                self.x.index_copy_(0, torch.tensor(group, device=x.device), x)
        rows = smallest_at_least(n, self.row_buckets)
        kv_len = smallest_at_least(max(starts) + UNIT_FRAMES, self.kv_buckets)
        pad = rows - n
        packed = upload([[*(s.slot for s in states), *[self.pool.scratch] * pad], [*starts, *[0] * pad]], self.x.device)
        self.slots[:rows].copy_(packed[0])
        self.starts[:rows].copy_(packed[1])
        self._launch(rows, kv_len)
        return self.out[:n].clone()
