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
from functools import partial
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
    """One decoder layer's weights as plain tensors (the module's own), unpacked into the layer function's
    arguments, so that one compiled graph serves every layer with its weights as inputs."""

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
    input_norm: torch.Tensor,  # the fields of LayerWeights, in order
    qkv_weight: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    o_proj: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    keys: torch.Tensor,  # this layer's pool [S + 1, H_kv, C, hd], written in place
    values: torch.Tensor,
    slot_rows: torch.Tensor,  # [R, T] slot each position writes to
    write_at: torch.Tensor,  # [R, T] position it writes at
    slot_ids: torch.Tensor,  # [R] slot each row reads
    cos: torch.Tensor,  # [R, T, 1, hd]
    signed_sin: torch.Tensor,  # [R, T, 1, hd]
    mask: torch.Tensor | None,  # [R, 1, groups x T, L]; None only where pool_attention serves the step
    kv_len: int,
    *,
    shape: AttentionShape,
    pool_attention: bool = False,
) -> torch.Tensor:
    """One Qwen3 / Llama decoder layer (SiLU MLP) over the pool: writes the rows' keys and values, returns h.

    ``pool_attention``: one-position rows attend through ``decode_attention`` (CUDA) instead of a gather + SDPA.
    """
    R, T, _ = h.shape
    hd, eps = shape.head_dim, shape.norm_eps
    y = F.rms_norm(h, (h.shape[-1],), weight=input_norm, eps=eps)
    qkv = F.linear(y, qkv_weight)
    q_width, kv_width = shape.heads * hd, shape.kv_heads * hd
    q = qkv[..., :q_width].view(R, T, shape.heads, hd)
    k = qkv[..., q_width : q_width + kv_width].view(R, T, shape.kv_heads, hd)
    v = qkv[..., q_width + kv_width :].view(R, T, shape.kv_heads, hd)
    if q_norm is not None:
        q = F.rms_norm(q, (hd,), weight=q_norm, eps=eps)
        k = F.rms_norm(k, (hd,), weight=k_norm, eps=eps)
    # rotate_half(x) * sin == roll(x, half) * signed_sin: the rotation in three kernels (mul, roll, addcmul)
    qk = torch.cat([q, k], dim=2)  # [R, T, H + H_kv, hd]: queries and keys rotated together
    qk = torch.addcmul(qk * cos, qk.roll(hd // 2, dims=-1), signed_sin)
    q, k = qk[:, :, : shape.heads].transpose(1, 2), qk[:, :, shape.heads :]  # [R, H, T, hd], [R, T, H_kv, hd]
    keys[slot_rows, :, write_at] = k  # [R, T, H_kv, hd] into [S, H_kv, C, hd]
    values[slot_rows, :, write_at] = v
    # Grouped queries share their KV head: the groups are folded into the query axis instead of repeating keys.
    qg = q.reshape(R, shape.kv_heads, shape.groups * T, hd)
    if pool_attention and T == 1:  # the pool read in place (decode_attention.py); its visible keys: 0 .. position
        out = torch.ops.parley.decode_attention(qg, keys, values, slot_ids, write_at[:, 0] + 1, kv_len, shape.scaling)
    else:
        ks, vs = keys[slot_ids, :, :kv_len], values[slot_ids, :, :kv_len]  # [R, H_kv, L, hd]
        out = F.scaled_dot_product_attention(qg, ks, vs, attn_mask=mask, scale=shape.scaling)
    out = out.reshape(R, shape.heads, T, hd).transpose(1, 2).reshape(R, T, -1)
    h = residual_linear(h, out, o_proj)
    gate, up = F.linear(F.rms_norm(h, (h.shape[-1],), weight=post_norm, eps=eps), gate_up).chunk(2, dim=-1)
    return residual_linear(h, F.silu(gate) * up, down)


class RowDecoder:
    """The decoder layers of ``model`` run row-batched over a ``KVPool``.

    Args:
        model: a ``Qwen3Model`` or ``LlamaModel`` (``layers``, ``norm``, ``rotary_emb``); Qwen3's per-head
            q/k norms are used when present.
        compile_steps: run one-position feeds (decode steps) through a ``torch.compile``d layer.
        pool_attention: one-position feeds attend through ``decode_attention`` (Triton; CUDA, or the CPU
            interpreter in tests) instead of gathering each row's slot for SDPA.
    """

    def __init__(self, model: nn.Module, *, compile_steps: bool = False, pool_attention: bool = False):
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
        # One-token steps through one compiled layer (every layer's weights are its inputs): torch.compile
        # fuses each layer's norms, rotation and cache writes into a few kernels; a step is mostly such small
        # kernels. Shapes are dynamic, so the row and KV buckets share compiled code; torch still compiles apart
        # what it specialises (1 row, sizes that happen to coincide), and the LLM and TTS share the function.
        if pool_attention:
            from inference.models.minicpmo.fast import decode_attention  # noqa: F401  (registers the op; Triton)
        self.pool_attention = pool_attention
        self._layer = partial(decoder_layer, shape=self.shape, pool_attention=pool_attention)
        self._compiled_layer = None
        if compile_steps:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            # Without duck shapes a row count that happens to equal another size (4 groups, 8 KV heads) does
            # not tie the two together, which would recompile at the next row bucket.
            torch.fx.experimental._config.use_duck_shape = False
            self._compiled_layer = torch.compile(self._layer, dynamic=True, fullgraph=True)

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
        slot_rows = slot_ids[:, None].expand(R, T)
        write_at = positions
        if lengths is not None:
            real = steps[None, :] < lengths[:, None]  # [R, T]
            slot_rows = torch.where(real, slot_rows, pool.scratch)
            write_at = positions.clamp(max=pool.capacity - 1)  # padding may run past the slot's end
        cos, sin = self.model.rotary_emb(x, positions)  # [R, T, hd]
        # rotate_half(x) * sin == roll(x, half) * signed_sin (see decoder_layer)
        half = self.shape.head_dim // 2
        signed_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        cos, signed_sin = cos[:, :, None], signed_sin[:, :, None]  # [R, T, 1, hd]: every head of a position
        mask = None  # decode_attention reads each row's length instead
        if not (self.pool_attention and T == 1):
            # Query (r, t) sees key j of its slot iff j <= its own position.
            groups = self.shape.groups
            mask = torch.arange(kv_len, device=x.device)[None, None, :] <= positions[:, :, None]  # [R, T, L]
            # Grouped queries share their KV head: fold the groups into the query axis instead of repeating keys.
            mask = mask[:, None, None].expand(R, 1, groups, T, kv_len).reshape(R, 1, groups * T, kv_len)
        layer = self._compiled_layer if (self._compiled_layer is not None and T == 1) else self._layer
        h = x
        for i, weights in enumerate(self.layers):
            h = layer(
                h, *weights, pool.keys[i], pool.values[i], slot_rows, write_at, slot_ids, cos, signed_sin, mask, kv_len
            )
        return rms_norm(self.model.norm, h)
