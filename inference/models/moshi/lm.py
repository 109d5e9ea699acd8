"""The Moshi LM: temporal transformer ("Helium") over frame columns plus the per-codebook depformer.

Module and parameter names equal the published fused key layout (``transformer.layers.N.self_attn.in_proj_weight``,
``depformer.layers.N.gating.K.linear_in.weight`` ...), so ``state_dict()`` keys are the checkpoint keys.

Streaming state lives outside the modules in explicit ring tensors (``TemporalKV``): a step is sync-free, has
static shapes per batch size, and applies the per-row execution mask with ``torch.where``. The numerics follow
moshi 0.2.13 operation by operation (RMSNorm in fp32, interleaved RoPE in fp32, SDPA over the whole ring with
a boolean mask, gating as ``silu(a) * b``), which is what makes token-for-token parity possible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from inference.models.moshi.config import LMConfig


class RMSNorm(nn.Module):
    """RMSNorm with gain ``alpha`` [1, 1, dim]; statistics in ``compute_dtype`` (fp32 for ``rms_norm_f32``)."""

    def __init__(self, dim: int, eps: float, compute_dtype: torch.dtype | None):
        super().__init__()
        self.eps = eps
        self.compute_dtype = compute_dtype
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, D]
        x_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        var = self.eps + torch.mean(x**2, dim=2, keepdim=True)
        return (x * (self.alpha.to(var) * torch.rsqrt(var))).to(x_dtype)


def make_norm(config: LMConfig, dim: int) -> RMSNorm:
    if config.norm == "rms_norm_f32":
        return RMSNorm(dim, eps=1e-8, compute_dtype=torch.float32)
    return RMSNorm(dim, eps=1e-5, compute_dtype=None)


class Gating(nn.Module):
    """SiLU-gated FFN: ``linear_out(silu(a) * b)`` with ``[a | b] = linear_in(x)``."""

    def __init__(self, dim: int, dim_feedforward: int):
        super().__init__()
        hidden = LMConfig.gated_hidden(dim, dim_feedforward)
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, D]
        h = F.linear(x, self.linear_in.weight)
        B, T, _ = h.shape
        h = h.view(B, T, 2, -1)
        return F.linear(F.silu(h[..., 0, :]) * h[..., 1, :], self.linear_out.weight)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, max_period: float):
    """Interleaved RoPE on pairs (2i, 2i+1), computed in fp32.

    Args:
        q, k: [B, H, 1, D].
        positions: [B] long, the frame position of each row.
    """
    D = q.shape[-1]
    ds = torch.arange(D // 2, device=q.device, dtype=torch.float32)
    freqs = torch.exp(ds * (-math.log(max_period) * 2 / D))
    ts = positions.float().view(-1, 1) + torch.arange(1, device=q.device, dtype=torch.float32)
    ts = ts.view(-1, 1, 1, 1)  # [B, 1, T=1, 1]
    rotr, roti = torch.cos(freqs * ts), torch.sin(freqs * ts)
    qv, kv = q.view(*q.shape[:-1], D // 2, 2), k.view(*k.shape[:-1], D // 2, 2)
    qr, qi = qv[..., 0].float(), qv[..., 1].float()
    kr, ki = kv[..., 0].float(), kv[..., 1].float()
    dtype = q.dtype
    qo = torch.stack([(qr * rotr - qi * roti).to(dtype), (qr * roti + qi * rotr).to(dtype)], dim=-1)
    ko = torch.stack([(kr * rotr - ki * roti).to(dtype), (kr * roti + ki * rotr).to(dtype)], dim=-1)
    return qo.view(*q.shape[:-1], D), ko.view(*k.shape[:-1], D)


# ---- temporal transformer ------------------------------------------------------------------------------


@dataclass
class TemporalKV:
    """Preallocated KV rings of the temporal transformer, one per layer.

    Attributes:
        keys, values: [L, B, H, context, Dh] each.
        lengths: [B] long: frames written per row since its reset (= the next frame's position).
    """

    keys: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def allocate(cls, config: LMConfig, batch_size: int, device, dtype) -> TemporalKV:
        shape = (config.num_layers, batch_size, config.num_heads, config.kv_window, config.dim // config.num_heads)
        return cls(
            keys=torch.zeros(shape, device=device, dtype=dtype),
            values=torch.zeros(shape, device=device, dtype=dtype),
            lengths=torch.zeros(batch_size, device=device, dtype=torch.long),
        )

    def reset(self, mask: torch.Tensor) -> None:
        """Forget everything of the rows in ``mask`` [B] bool (stale entries are masked by position)."""
        self.lengths.copy_(torch.where(mask, torch.zeros_like(self.lengths), self.lengths))


class TemporalAttention(nn.Module):
    """Causal self-attention over a ring of ``config.kv_window`` frames (see there for PersonaPlex's window)."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.context = config.kv_window
        self.max_period = config.max_period
        self.in_proj_weight = nn.Parameter(torch.empty(3 * config.dim, config.dim))
        self.out_proj = nn.Linear(config.dim, config.dim, bias=False)

    def forward(self, x, keys, values, lengths, exec_mask):
        """One frame.

        Args:
            x: [B, 1, D] normed input.
            keys, values: [B, H, C, Dh] this layer's rings, updated in place for executing rows.
            lengths: [B] frames already in the ring (position of this frame).
            exec_mask: [B] bool.
        """
        B = x.shape[0]
        C = self.context
        qkv = F.linear(x, self.in_proj_weight).view(B, 1, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, 1, Dh]
        q, k = apply_rope(q, k, lengths, self.max_period)
        # Write this frame's k/v at its ring slot; rows that do not execute keep the old entry.
        slot = (lengths % C).view(B, 1, 1, 1).expand(-1, k.shape[1], 1, k.shape[3])
        keep = ~exec_mask.view(B, 1, 1, 1)
        keys.scatter_(2, slot, torch.where(keep, keys.gather(2, slot), k))
        values.scatter_(2, slot, torch.where(keep, values.gather(2, slot), v))
        # Ring positions exactly as moshi's RingKVCache computes them (its `delta <= 0` convention included).
        indexes = torch.arange(C, device=x.device, dtype=torch.long)
        last = lengths.view(-1, 1)
        delta = indexes - last % C
        pos_k = torch.where(delta <= 0, last + delta, last + delta - C)
        pos_k = torch.where(indexes >= (lengths + 1).view(-1, 1), torch.full_like(pos_k, -1), pos_k)
        dpos = lengths.view(-1, 1) - pos_k
        attn_bias = ((pos_k >= 0) & (dpos >= 0) & (dpos < C))[:, None, None, :]  # [B, 1, 1, C]
        out = F.scaled_dot_product_attention(q, keys, values, attn_bias, dropout_p=0.0)
        out = out.transpose(1, 2).reshape(B, 1, -1)
        return self.out_proj(out)


class TemporalLayer(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        self.self_attn = TemporalAttention(config)
        self.norm1 = make_norm(config, config.dim)
        self.norm2 = make_norm(config, config.dim)
        self.gating = Gating(config.dim, config.dim_feedforward)

    def forward(self, x, keys, values, lengths, exec_mask):
        update = self.self_attn(self.norm1(x), keys, values, lengths, exec_mask)
        x = x.to(update) + update
        update = self.gating(self.norm2(x))
        return x.to(update) + update


class TemporalTransformer(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        self.layers = nn.ModuleList([TemporalLayer(config) for _ in range(config.num_layers)])

    def forward(self, x: torch.Tensor, kv: TemporalKV, exec_mask: torch.Tensor) -> torch.Tensor:
        """x: [B, 1, D] -> [B, 1, D]; advances ``kv.lengths`` of executing rows."""
        for i, layer in enumerate(self.layers):
            x = layer(x, kv.keys[i], kv.values[i], kv.lengths, exec_mask)
        kv.lengths.copy_(torch.where(exec_mask, kv.lengths + 1, kv.lengths))
        return x


# ---- depformer ---------------------------------------------------------------------------------------------


class DepformerAttention(nn.Module):
    """Causal attention over the codebook steps of one frame; step k uses its own slice of the fused weights."""

    def __init__(self, config: LMConfig):
        super().__init__()
        d = config.depformer_dim
        self.num_heads = config.depformer_num_heads
        self.dim = d
        self.in_proj_weight = nn.Parameter(torch.empty(config.dep_q * 3 * d, d))
        self.out_proj = nn.Linear(d, config.dep_q * d, bias=False)  # weight [dep_q * d, d]: per-step stack

    def forward(self, x, step: int, keys, values):
        """x: [B, 1, d]; keys/values: [B, H, dep_q, dh] for this frame, filled up to ``step``."""
        B, d = x.shape[0], self.dim
        w_in = self.in_proj_weight[step * 3 * d : (step + 1) * 3 * d]
        qkv = F.linear(x, w_in).view(B, 1, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, 1, dh]
        keys[:, :, step : step + 1] = k
        values[:, :, step : step + 1] = v
        # Over the whole capacity with a mask (as the reference does), so the reductions match bit for bit.
        valid = torch.arange(keys.shape[2], device=x.device) <= step
        out = F.scaled_dot_product_attention(q, keys, values, valid.view(1, 1, 1, -1).expand(B, 1, 1, -1))
        out = out.transpose(1, 2).reshape(B, 1, -1)
        return F.linear(out, self.out_proj.weight[step * d : (step + 1) * d])


class DepformerLayer(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        d = config.depformer_dim
        self.self_attn = DepformerAttention(config)
        self.norm1 = make_norm(config, d)
        self.norm2 = make_norm(config, d)
        self.gating = nn.ModuleList([Gating(d, config.depformer_dim_feedforward) for _ in range(config.dep_q)])

    def forward(self, x, step: int, keys, values):
        update = self.self_attn(self.norm1(x), step, keys, values)
        x = x.to(update) + update
        update = self.gating[step](self.norm2(x))
        return x.to(update) + update


class Depformer(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        self.layers = nn.ModuleList([DepformerLayer(config) for _ in range(config.depformer_num_layers)])


class ZeroableEmbedding(nn.Embedding):
    """Embedding where token -1 gives an exact zero vector (moshi's ``ScaledEmbedding`` zero index)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        y = super().forward(tokens.clamp(min=0))
        return torch.where((tokens == -1)[..., None], torch.zeros((), dtype=y.dtype, device=y.device), y)


# ---- the LM ------------------------------------------------------------------------------------------------


class MoshiLM(nn.Module):
    """Temporal transformer + depformer with the published parameter names.

    Args:
        config: the LM configuration (widths, dep_q, delays, context).
    """

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        c = config
        self.emb = nn.ModuleList([ZeroableEmbedding(c.card + 1, c.dim) for _ in range(c.n_q)])
        self.text_emb = ZeroableEmbedding(c.text_card + 1, c.dim)
        self.text_linear = nn.Linear(c.dim, c.text_card, bias=False)
        self.transformer = TemporalTransformer(c)
        self.out_norm = make_norm(c, c.dim)
        self.depformer_in = nn.ModuleList([nn.Linear(c.dim, c.depformer_dim, bias=False) for _ in range(c.dep_q)])
        self.depformer_emb = nn.ModuleList([ZeroableEmbedding(c.card + 1, c.depformer_dim) for _ in range(c.dep_q - 1)])
        self.depformer_text_emb = ZeroableEmbedding(c.text_card + 1, c.depformer_dim)
        self.depformer = Depformer(c)
        self.linears = nn.ModuleList([nn.Linear(c.depformer_dim, c.card, bias=False) for _ in range(c.dep_q)])

    def embed_codes(self, column: torch.Tensor) -> torch.Tensor:
        """column: [B, 1 + n_q] tokens -> [B, 1, dim]: the sum of the audio embeddings, then + text."""
        x = None
        for k, emb in enumerate(self.emb):
            e = emb(column[:, k + 1 : k + 2])
            x = e if x is None else x + e
        t = self.text_emb(column[:, :1])
        return t if x is None else x + t

    def forward_embeddings(self, x: torch.Tensor, kv: TemporalKV, exec_mask: torch.Tensor):
        """x: [B, 1, dim] -> (hidden [B, 1, dim] after out_norm, text logits [B, text_card])."""
        h = self.out_norm(self.transformer(x, kv, exec_mask))
        return h, self.text_linear(h)[:, 0]

    def depformer_logits(self, step: int, token: torch.Tensor, hidden: torch.Tensor, keys, values) -> torch.Tensor:
        """One depformer step: token [B] (text for step 0, codebook step-1 otherwise) -> logits [B, card]."""
        x = self.depformer_in[step](hidden)
        emb = self.depformer_text_emb if step == 0 else self.depformer_emb[step - 1]
        x = x + emb(token[:, None])
        for i, layer in enumerate(self.depformer.layers):
            x = layer(x, step, keys[i], values[i])
        return self.linears[step](x)[:, 0]

    def allocate_depformer_kv(self, batch_size: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-frame depformer KV: [L, B, H, dep_q, dh] each (zeroed once; every frame overwrites it in order)."""
        c = self.config
        shape = (
            c.depformer_num_layers,
            batch_size,
            c.depformer_num_heads,
            c.dep_q,
            c.depformer_dim // c.depformer_num_heads,
        )
        return torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)
