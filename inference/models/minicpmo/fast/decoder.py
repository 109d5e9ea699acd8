"""A row-batched forward over a ``transformers`` Llama-family decoder (Qwen3 LLM, Llama TTS) with a static KV pool.

The weights are the loaded ``Qwen3Model`` / ``LlamaModel``'s own modules; only the cache and the batching are
new. A *slot* is one session's KV: ``keys[layer][slot]`` is ``[kv_heads, capacity, head_dim]``, preallocated
once, so no feed allocates. A forward runs ``R`` rows of ``T`` positions: row ``r`` belongs to slot
``slot_ids[r]`` and starts at position ``starts[r]``; it writes its keys and values there and attends to
positions ``0 .. own`` of its slot within the first ``kv_len`` positions. ``kv_len`` is the only shape that
depends on the call's history, so a decode step (``T = 1``) captured per (rows, kv_len bucket) serves any
mix of sessions: which slots and positions are data, not shape. Slot ``num_slots`` is scratch (padding rows).

Why not ``transformers``' StaticCache: it has one batch layout for one call, while a tick here steps a
different subset of sessions, each at its own position, every second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class KVPool:
    """Preallocated keys and values of ``num_slots`` sessions (+1 scratch slot) for every layer.

    Args:
        layers, kv_heads, head_dim: the decoder's attention shape.
        num_slots: sessions the pool holds at once.
        capacity: positions per slot.
    """

    def __init__(self, *, layers: int, kv_heads: int, head_dim: int, num_slots: int, capacity: int, device, dtype):
        shape = (num_slots + 1, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.capacity = capacity
        self.num_slots = num_slots
        self.free = list(range(num_slots))

    @property
    def scratch(self) -> int:
        """Padding rows write here, never into a session's slot."""
        return self.num_slots

    def acquire(self) -> int:
        """A free slot (its old contents are never read: a row reads only positions it wrote)."""
        if not self.free:
            raise RuntimeError(f"all {self.num_slots} KV slots are in use")
        return self.free.pop(0)

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def bytes_per_slot(self) -> int:
        k = self.keys[0]
        return 2 * len(self.keys) * k[0].numel() * k.element_size()

    def shift_left(self, slot: int, start: int, count: int, length: int, rotary: nn.Module) -> None:
        """Remove positions [start, start + count) of ``slot`` (length ``length``), re-rotating the keys after.

        RoPE is a rotation, so a key at position p rotated by -count is the key it would have had at
        p - count: the remaining context is what it would be had the span never been fed.
        """
        tail = slice(start + count, length)
        dest = slice(start, length - count)
        shift = torch.full((1, 1), count, device=self.keys[0].device, dtype=torch.long)
        for keys, values in zip(self.keys, self.values, strict=True):
            k = keys[slot, :, tail]  # [H, n, hd]
            cos, sin = rotary(k, shift)  # [1, 1, hd]
            cos, sin = cos[0].to(k.dtype), sin[0].to(k.dtype)
            keys[slot, :, dest] = k * cos - _rotate_half(k) * sin
            values[slot, :, dest] = values[slot, :, tail].clone()


def fused_linear_weight(owner: nn.Module, name: str, linears: list[nn.Linear]) -> torch.Tensor:
    """One weight [sum of outputs, in] for bias-free ``linears`` fed the same input, so one GEMM serves them all.

    The linears' own weights become views of it (no second copy; the eager path runs on the same numbers), and
    it is kept on ``owner`` as ``name`` so that a second decoder over the same model reuses it.
    """
    fused = getattr(owner, name, None)
    if fused is not None:
        return fused
    if any(linear.bias is not None for linear in linears):
        raise ValueError("fused projections must be bias-free")
    fused = torch.cat([linear.weight.data for linear in linears])
    offset = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = fused[offset : offset + rows]
        offset += rows
    setattr(owner, name, fused)
    return fused


class TorchRowOps:
    """The layer's reductions as torch ops (CPU; float32 tests against the goldens)."""

    linear = staticmethod(F.linear)

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Qwen3 / Llama RMSNorm in the modules' order: float32 statistics, cast back, then the weight."""
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    @staticmethod
    def attend(q, keys, values, slot_ids, starts, kv_len, scale, groups):
        """q [R, H, T, hd] over each row's slot, causal from ``starts``: [R, T, H, hd]."""
        R, H, T, hd = q.shape
        positions = starts[:, None] + torch.arange(T, device=q.device)  # [R, T]
        visible = torch.arange(kv_len, device=q.device)[None, None, :] <= positions[:, :, None]  # [R, T, L]
        # Grouped queries share their KV head: the groups fold into the query axis instead of repeating keys.
        mask = visible[:, None, None].expand(R, 1, groups, T, kv_len).reshape(R, 1, groups * T, kv_len)
        ks, vs = keys[slot_ids, :, :kv_len], values[slot_ids, :, :kv_len]  # [R, H_kv, L, hd]
        qg = q.reshape(R, H // groups, groups * T, hd)
        out = F.scaled_dot_product_attention(qg, ks, vs, attn_mask=mask, scale=scale)
        return out.reshape(R, H, T, hd).transpose(1, 2)


@dataclass(frozen=True)
class AttentionShape:
    """What a layer's arithmetic needs besides tensors (constants of one decoder, the same for every layer)."""

    heads: int
    kv_heads: int
    head_dim: int
    scaling: float
    norm_eps: float

    @property
    def groups(self) -> int:
        return self.heads // self.kv_heads


class LayerWeights(NamedTuple):
    """One decoder layer's weights as plain tensors (the module's own; q/k/v and gate/up fused)."""

    input_norm: torch.Tensor
    qkv: torch.Tensor  # [q + k + v outputs, D]
    q_norm: torch.Tensor | None  # Qwen3's per-head norms; None for Llama
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 x intermediate, D]
    down: torch.Tensor


def decoder_layer(
    h: torch.Tensor,  # [R, T, D]
    weights: LayerWeights,
    keys: torch.Tensor,  # this layer's pool [S + 1, H_kv, C, hd], written in place
    values: torch.Tensor,
    rows: RowPositions,
    *,
    shape: AttentionShape,
    ops: type,  # TorchRowOps or invariant.kernels.RowOps
) -> torch.Tensor:
    """One Qwen3 / Llama decoder layer (SiLU MLP) over the pool: writes the rows' keys and values, returns h.

    Every rounding happens where ``transformers``' modules round (the norm's cast before its weight, the
    rotation's two products, each residual addition after its projection), so with the invariant kernels'
    ``RowOps`` the bits equal the eager model's with the same kernels swapped in (``invariant.modules``).
    """
    R, T, _ = h.shape
    hd, eps = shape.head_dim, shape.norm_eps
    qkv = ops.linear(ops.rms_norm(h, weights.input_norm, eps), weights.qkv)
    q_width, kv_width = shape.heads * hd, shape.kv_heads * hd
    q = qkv[..., :q_width].view(R, T, shape.heads, hd)
    k = qkv[..., q_width : q_width + kv_width].view(R, T, shape.kv_heads, hd)
    v = qkv[..., q_width + kv_width :].view(R, T, shape.kv_heads, hd)
    if weights.q_norm is not None:
        q = ops.rms_norm(q, weights.q_norm, eps)
        k = ops.rms_norm(k, weights.k_norm, eps)
    # queries and keys rotated together; rotate_half(x) * sin is roll(x, half) * signed_sin to the bit
    qk = torch.cat([q, k], dim=2)  # [R, T, H + H_kv, hd]
    qk = qk * rows.cos + qk.roll(hd // 2, dims=-1) * rows.signed_sin
    q, k = qk[:, :, : shape.heads].transpose(1, 2), qk[:, :, shape.heads :]  # [R, H, T, hd], [R, T, H_kv, hd]
    keys[rows.write_slots, :, rows.write_at] = k  # [R, T, H_kv, hd] into [S, H_kv, C, hd]
    values[rows.write_slots, :, rows.write_at] = v
    out = ops.attend(q, keys, values, rows.slot_ids, rows.starts, rows.kv_len, shape.scaling, shape.groups)
    h = h + ops.linear(out.reshape(R, T, -1), weights.o_proj)
    gate, up = ops.linear(ops.rms_norm(h, weights.post_norm, eps), weights.gate_up).chunk(2, dim=-1)
    return h + ops.linear(F.silu(gate) * up, weights.down)


@dataclass(frozen=True)
class RowPositions:
    """Where a forward's rows read and write (the same for every layer)."""

    slot_ids: torch.Tensor  # [R] slot each row reads
    starts: torch.Tensor  # [R] first position of each row
    write_slots: torch.Tensor  # [R, T] slot each position writes to (padding: the scratch slot)
    write_at: torch.Tensor  # [R, T] position it writes at
    cos: torch.Tensor  # [R, T, 1, hd]
    signed_sin: torch.Tensor  # [R, T, 1, hd]
    kv_len: int


class RowDecoder:
    """The decoder layers of ``model`` run row-batched over a ``KVPool``.

    Args:
        model: a ``Qwen3Model`` or ``LlamaModel`` (``layers``, ``norm``, ``rotary_emb``); Qwen3's per-head
            q/k norms are used when present.
        invariant: reduce through the row-invariant Triton kernels (CUDA) instead of torch's ops.
    """

    def __init__(self, model: nn.Module, *, invariant: bool = False):
        self.model = model
        attn = model.layers[0].self_attn
        head_dim = attn.head_dim
        if getattr(model.config, "hidden_act", "silu") != "silu":
            raise ValueError(f"RowDecoder runs SiLU MLPs, not {model.config.hidden_act}")
        self.shape = AttentionShape(
            heads=attn.q_proj.out_features // head_dim,
            kv_heads=attn.k_proj.out_features // head_dim,
            head_dim=head_dim,
            scaling=head_dim**-0.5,
            norm_eps=model.layers[0].input_layernorm.variance_epsilon,
        )
        # q, k and v in one GEMM and gate and up in another: a decode step is launch-bound, not bandwidth-bound
        # (the invariant GEMM gives each output column the same bits fused or not)
        self.layers = [
            LayerWeights(
                input_norm=layer.input_layernorm.weight,
                qkv=fused_linear_weight(
                    layer.self_attn,
                    "parley_qkv",
                    [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj],
                ),
                q_norm=layer.self_attn.q_norm.weight if hasattr(layer.self_attn, "q_norm") else None,
                k_norm=layer.self_attn.k_norm.weight if hasattr(layer.self_attn, "k_norm") else None,
                o_proj=layer.self_attn.o_proj.weight,
                post_norm=layer.post_attention_layernorm.weight,
                gate_up=fused_linear_weight(layer.mlp, "parley_gate_up", [layer.mlp.gate_proj, layer.mlp.up_proj]),
                down=layer.mlp.down_proj.weight,
            )
            for layer in model.layers
        ]
        self.ops = TorchRowOps
        if invariant:
            from inference.models.minicpmo.invariant.kernels import RowOps  # Triton: imported only where it runs

            self.ops = RowOps
        self.final_norm = (model.norm.weight, model.norm.variance_epsilon)

    def new_pool(self, num_slots: int, capacity: int) -> KVPool:
        w = self.model.norm.weight
        return KVPool(
            layers=len(self.model.layers),
            kv_heads=self.shape.kv_heads,
            head_dim=self.shape.head_dim,
            num_slots=num_slots,
            capacity=capacity,
            device=w.device,
            dtype=w.dtype,
        )

    def forward(
        self,
        pool: KVPool,
        x: torch.Tensor,  # [R, T, D] input embeddings
        slot_ids: torch.Tensor,  # [R] long
        starts: torch.Tensor,  # [R] long, first position of each row
        kv_len: int,  # positions visible to the attention (>= every row's last real position + 1)
        lengths: torch.Tensor | None = None,  # [R] long, real positions of each row (the rest is padding)
    ) -> torch.Tensor:
        """Final-normed hidden states [R, T, D]; writes each row's keys/values into its slot.

        With ``lengths``, row ``r``'s positions from ``lengths[r]`` on are padding: their keys and values go to
        the scratch slot, so the session's slot holds exactly what an unpadded run writes. Attention is causal,
        so a real position never sees padding; padded positions' outputs are garbage, to be ignored.
        """
        R, T, _ = x.shape
        steps = torch.arange(T, device=x.device)
        positions = starts[:, None] + steps  # [R, T]
        write_slots = slot_ids[:, None].expand(R, T)
        write_at = positions
        if lengths is not None:
            real = steps[None, :] < lengths[:, None]  # [R, T]
            write_slots = torch.where(real, write_slots, pool.scratch)
            write_at = positions.clamp(max=pool.capacity - 1)  # padding may run past the slot's end
        cos, sin = self.model.rotary_emb(x, positions)  # [R, T, hd]
        half = self.shape.head_dim // 2
        signed_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # see decoder_layer
        rows = RowPositions(slot_ids, starts, write_slots, write_at, cos[:, :, None], signed_sin[:, :, None], kv_len)
        h = x
        for i, weights in enumerate(self.layers):
            h = decoder_layer(h, weights, pool.keys[i], pool.values[i], rows, shape=self.shape, ops=self.ops)
        return self.ops.rms_norm(h, *self.final_norm)
