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


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Qwen3 / Llama RMSNorm module applied in torch's fused kernel (one launch on CUDA instead of eight).

    Same statistics in float32; the weight is applied before the cast back instead of after, which changes
    only the last bit of some bf16 outputs (float32: the same products).
    """
    return F.rms_norm(x, (x.shape[-1],), weight=norm.weight, eps=norm.variance_epsilon)


def residual_linear(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``residual + x @ weight.T`` in one GEMM (the addition in its epilogue instead of a kernel of its own)."""
    shape = residual.shape
    out = torch.addmm(residual.reshape(-1, shape[-1]), x.reshape(-1, x.shape[-1]), weight.t())
    return out.view(shape)


class RowDecoder:
    """The decoder layers of ``model`` run row-batched over a ``KVPool``.

    Args:
        model: a ``Qwen3Model`` or ``LlamaModel`` (``layers``, ``norm``, ``rotary_emb``); Qwen3's per-head
            q/k norms are used when present.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        attn = model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = attn.q_proj.out_features // self.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim**-0.5
        # q, k and v in one GEMM and gate and up in another: a decode step is launch-bound, not bandwidth-bound
        self.qkv = [
            fused_linear_weight(
                layer.self_attn, "parley_qkv", [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]
            )
            for layer in model.layers
        ]
        self.gate_up = [
            fused_linear_weight(layer.mlp, "parley_gate_up", [layer.mlp.gate_proj, layer.mlp.up_proj])
            for layer in model.layers
        ]

    def new_pool(self, num_slots: int, capacity: int) -> KVPool:
        w = self.model.norm.weight
        return KVPool(
            layers=len(self.model.layers),
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
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
        slot_rows = slot_ids[:, None].expand(R, T)
        write_at = positions
        if lengths is not None:
            real = steps[None, :] < lengths[:, None]  # [R, T]
            slot_rows = torch.where(real, slot_rows, pool.scratch)
            write_at = positions.clamp(max=pool.capacity - 1)  # padding may run past the slot's end
        cos, sin = self.model.rotary_emb(x, positions)  # [R, T, hd]
        # rotate_half(x) * sin == roll(x, half) * signed_sin: the rotation in three kernels (mul, roll, addcmul)
        half = self.head_dim // 2
        signed_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        cos, signed_sin = cos[:, :, None], signed_sin[:, :, None]  # [R, T, 1, hd]: every head of a position
        # Query (r, t) sees key j of its slot iff j <= its own position.
        mask = torch.arange(kv_len, device=x.device)[None, None, :] <= positions[:, :, None]  # [R, T, L]
        # Grouped queries share their KV head: fold the groups into the query axis instead of repeating keys.
        mask = mask[:, None, None].expand(R, 1, self.groups, T, kv_len).reshape(R, 1, self.groups * T, kv_len)
        h = x
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            y = rms_norm(layer.input_layernorm, h)
            qkv = F.linear(y, self.qkv[i])
            q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
            q = qkv[..., :q_width].view(R, T, self.heads, self.head_dim)
            k = qkv[..., q_width : q_width + kv_width].view(R, T, self.kv_heads, self.head_dim)
            v = qkv[..., q_width + kv_width :].view(R, T, self.kv_heads, self.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = rms_norm(attn.q_norm, q), rms_norm(attn.k_norm, k)
            qk = torch.cat([q, k], dim=2)  # [R, T, H + H_kv, hd]: queries and keys rotated together
            qk = torch.addcmul(qk * cos, qk.roll(half, dims=-1), signed_sin)
            q, k = qk[:, :, : self.heads].transpose(1, 2), qk[:, :, self.heads :]  # [R, H, T, hd], [R, T, H_kv, hd]
            keys, values = pool.keys[i], pool.values[i]
            keys[slot_rows, :, write_at] = k  # [R, T, H_kv, hd] into [S, H_kv, C, hd]
            values[slot_rows, :, write_at] = v
            ks, vs = keys[slot_ids, :, :kv_len], values[slot_ids, :, :kv_len]  # [R, H_kv, L, hd]
            qg = q.reshape(R, self.kv_heads, self.groups * T, self.head_dim)
            out = F.scaled_dot_product_attention(qg, ks, vs, attn_mask=mask, scale=self.scaling)
            out = out.reshape(R, self.heads, T, self.head_dim).transpose(1, 2).reshape(R, T, -1)
            h = residual_linear(h, out, attn.o_proj.weight)
            gate, up = F.linear(rms_norm(layer.post_attention_layernorm, h), self.gate_up[i]).chunk(2, dim=-1)
            h = residual_linear(h, layer.mlp.act_fn(gate) * up, layer.mlp.down_proj.weight)
        return rms_norm(self.model.norm, h)
