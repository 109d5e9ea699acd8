"""The fast path's fused operations, each with a plain-torch twin.

On CUDA with Triton installed, ``use_triton(x)`` is true and the kernels of ``triton_kernels`` run. Everywhere
else (CPU, CI, a GPU without Triton) the torch versions below compute the same function, op for op in moshi's
order, so the CPU fallback is the readable specification of every kernel and the kernels' tests compare
against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:  # Triton is optional: the CPU wheel of torch does not ship it
    from inference.models.moshi.fast import triton_kernels as _tk
except ImportError:  # pragma: no cover - depends on the environment
    _tk = None

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def triton_available() -> bool:
    return _tk is not None


def use_triton(x: torch.Tensor) -> bool:
    return _tk is not None and x.is_cuda


# ---- RMSNorm and gating ---------------------------------------------------------------------------------


def rmsnorm_torch(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
    """x [R, N]; fp32 statistics, result in x's dtype (moshi ``_rms_norm`` with dtype fp32)."""
    xf = x.float()
    var = eps + torch.mean(xf**2, dim=1, keepdim=True)
    return (xf * (alpha.float().view(1, -1) * torch.rsqrt(var))).to(x.dtype)


def rmsnorm(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        return _tk.rmsnorm(x, alpha, eps)
    return rmsnorm_torch(x, alpha, eps)


def silu_mul_torch(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[1] // 2
    return F.silu(x[:, :h]) * x[:, h:]


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        return _tk.silu_mul(x)
    return silu_mul_torch(x)


# ---- RoPE + KV ring write -------------------------------------------------------------------------------


def rope_torch(x: torch.Tensor, pos: torch.Tensor, max_period: float) -> torch.Tensor:
    """Interleaved RoPE of x [R, H, D] at positions pos [R], in fp32, rounded back to x's dtype."""
    D = x.shape[-1]
    ds = torch.arange(D // 2, device=x.device, dtype=torch.float32)
    freqs = torch.exp(ds * (-math.log(max_period) * 2 / D))
    ts = pos.float().view(-1, 1, 1)
    rotr, roti = torch.cos(freqs * ts), torch.sin(freqs * ts)
    pairs = x.view(*x.shape[:-1], D // 2, 2)
    xr, xi = pairs[..., 0].float(), pairs[..., 1].float()
    out = torch.stack([(xr * rotr - xi * roti).to(x.dtype), (xr * roti + xi * rotr).to(x.dtype)], dim=-1)
    return out.view(x.shape)


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (fp8 values, fp32 scale [...]) with one scale per vector (amax / 448)."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    return (xf / scale[..., None]).to(FP8_DTYPE), scale


@dataclass(frozen=True)
class KVLayer:
    """One layer's paged KV as the kernels see it (``kv.SlotKV.layer``).

    Attributes:
        keys, values: [num_pages, H, page_size, D] pools.
        key_scales, value_scales: [num_pages, H, page_size] fp32 (fp8 pools only, else None).
        page_table: [S, pages_per_slot] long: physical page of each slot's logical page.
        windows: [S] long: each slot's ring length.
        window: the longest ring (the model's ``kv_window``): how far a row's positions can reach.
    """

    keys: torch.Tensor
    values: torch.Tensor
    key_scales: torch.Tensor | None
    value_scales: torch.Tensor | None
    page_table: torch.Tensor
    windows: torch.Tensor
    window: int

    @property
    def page_size(self) -> int:
        return self.keys.shape[2]

    @classmethod
    def contiguous(cls, keys, values, key_scales=None, value_scales=None) -> KVLayer:
        """Rings [S, H, C, D] with one page per slot: slot s is page s (how tests hand the kernels plain rings)."""
        S, _, C = keys.shape[:3]
        table = torch.arange(S, device=keys.device).view(S, 1)
        windows = torch.full((S,), C, device=keys.device, dtype=torch.long)
        return cls(keys, values, key_scales, value_scales, table, windows, C)


def rope_kv_write_torch(qkv, kv: KVLayer, slot_ids, pos, max_period) -> torch.Tensor:
    R = qkv.shape[0]
    _, H, P, D = kv.keys.shape
    q, k, v = qkv.view(R, 3, H, D).unbind(1)
    q = rope_torch(q, pos, max_period)
    k = rope_torch(k, pos, max_period)
    ring_pos = pos % kv.windows[slot_ids]
    page = kv.page_table[slot_ids, ring_pos // P]
    offset = ring_pos % P
    if kv.key_scales is not None:
        k, ks = quantize_fp8(k)
        v, vs = quantize_fp8(v)
        kv.key_scales[page, :, offset] = ks
        kv.value_scales[page, :, offset] = vs
    kv.keys[page, :, offset] = k.to(kv.keys.dtype)
    kv.values[page, :, offset] = v.to(kv.values.dtype)
    return q


def rope_kv_write(qkv, kv: KVLayer, slot_ids, pos, max_period) -> torch.Tensor:
    """qkv [R, 3HD] -> q [R, H, D] after RoPE; k (RoPE'd) and v stored at ring position ``pos % window``."""
    if use_triton(qkv):
        return _tk.rope_kv_write(qkv, kv, slot_ids, pos, max_period)
    return rope_kv_write_torch(qkv, kv, slot_ids, pos, max_period)


# ---- attention ------------------------------------------------------------------------------------------


def gather_rings(pool: torch.Tensor, kv: KVLayer, slot_ids: torch.Tensor) -> torch.Tensor:
    """pool [pages, H, P, ...] -> each row's ring in logical order [R, H, window, ...] (pages joined)."""
    pages = pool[kv.page_table[slot_ids]]  # [R, pages_per_slot, H, P, ...]
    R, n, H, P = pages.shape[:4]
    rings = pages.transpose(1, 2).reshape(R, H, n * P, *pages.shape[4:])
    return rings[:, :, : kv.window]


def decode_attention_torch(q, kv: KVLayer, slot_ids, lengths) -> torch.Tensor:
    """Reference: every row attends to its ring positions ``0 .. lengths[r] - 1`` (order is irrelevant)."""
    R, H, D = q.shape
    C = kv.window
    keys = gather_rings(kv.keys, kv, slot_ids).to(q.dtype if kv.key_scales is None else torch.float32)
    values = gather_rings(kv.values, kv, slot_ids).to(keys.dtype)
    if kv.key_scales is not None:
        keys = (keys * gather_rings(kv.key_scales, kv, slot_ids)[..., None]).to(q.dtype)
        values = (values * gather_rings(kv.value_scales, kv, slot_ids)[..., None]).to(q.dtype)
    valid = torch.arange(C, device=q.device).view(1, C) < lengths.view(R, 1)  # [R, C]
    # entries past the window are never used, whatever they hold (like the kernel, which never reads them)
    keys = torch.where(valid[:, None, :, None], keys, torch.zeros((), dtype=keys.dtype))
    values = torch.where(valid[:, None, :, None], values, torch.zeros((), dtype=values.dtype))
    out = F.scaled_dot_product_attention(q[:, :, None], keys, values, valid[:, None, None, :])
    return out.reshape(R, H * D)


@dataclass(frozen=True)
class AttentionLaunch:
    """How the decode attention kernel is launched for one bucket (chosen by ``tuning.tune_attention``)."""

    splits: int = 1  # context chunks per (row, head), a power of two
    block_n: int = 64  # ring positions per loop iteration
    warps: int = 4
    stages: int = 2


def decode_attention(q, kv: KVLayer, slot_ids, lengths, launch: AttentionLaunch | None = None) -> torch.Tensor:
    """q [R, H, D] -> [R, H * D]; see ``triton_kernels.decode_attention``."""
    if use_triton(q):
        a = launch or AttentionLaunch()
        return _tk.decode_attention(q, kv, slot_ids, lengths, a.splits, a.block_n, a.warps, a.stages)
    return decode_attention_torch(q, kv, slot_ids, lengths)


def depformer_attention_torch(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, step: int):
    R = qkv.shape[0]
    _, H, _, D = k_cache.shape
    q, k, v = qkv.view(R, 3, H, D).unbind(1)
    k_cache[:, :, step] = k
    v_cache[:, :, step] = v
    out = F.scaled_dot_product_attention(q[:, :, None], k_cache[:, :, : step + 1], v_cache[:, :, : step + 1])
    return out.reshape(R, H * D)


def depformer_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, step: int):
    """Depformer step attention over the frame's steps 0..step; k/v of this step stored at ``step``."""
    if use_triton(qkv):
        return _tk.depformer_attention(qkv, k_cache, v_cache, step)
    return depformer_attention_torch(qkv, k_cache, v_cache, step)


# ---- depformer input and sampling -------------------------------------------------------------------------


def embed_add(base: torch.Tensor, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """base [R, N] + table[tokens] with token -1 -> zero vector and other negatives -> row 0 (moshi embedding)."""
    if use_triton(base):
        return _tk.embed_add(base, table, tokens)
    e = table[tokens.clamp(min=0)]
    e = torch.where((tokens == -1)[:, None], torch.zeros((), dtype=e.dtype, device=e.device), e)
    return base + e


def sample(
    logits: torch.Tensor,
    use_sampling: bool,
    temp: float,
    top_k: int,
    seeds: torch.Tensor,
    salt: int,
    generator: torch.Generator | None = None,
):
    """logits [R, V] -> [R] long. Greedy is ``argmax``; sampling is top-k + exponential race.

    On CUDA the sampled case is one fused kernel with its own device RNG stream (``seeds``); elsewhere it is
    ``gen.sample_token`` with ``generator`` (torch's global RNG when None). Greedy is bit-identical on both paths.
    """
    if not use_sampling or temp <= 0.0:
        return torch.argmax(logits, dim=-1)
    if use_triton(logits) and top_k > 0:
        return _tk.sample_top_k(logits, temp, top_k, seeds, salt)
    from inference.models.moshi.gen import sample_token

    return sample_token(logits.float(), True, temp, top_k, generator)


def small_gemv(x, weight, *, norm_alpha=None, eps: float = 1e-8, gate: bool = False, residual=None):
    """f(x) @ weight.T (+ residual), f = identity, RMSNorm or SiLU gate; one kernel on CUDA (few rows)."""
    if use_triton(x):
        return _tk.small_gemv(x, weight, norm_alpha=norm_alpha, eps=eps, gate=gate, residual=residual)
    if norm_alpha is not None:
        x = rmsnorm_torch(x, norm_alpha, eps)
    if gate:
        x = silu_mul_torch(x)
    y = x @ weight.t()
    return y if residual is None else residual + y
