"""Triton kernels of the GPU fast path: fused RMSNorm, SiLU gate, RoPE + KV write, windowed decode attention.

Each kernel replaces a chain of small eager ops (moshi's fp32 RMSNorm alone is five launches) so that the
graphed step launches as few kernels as possible; at batch 1 the step is launch- and latency-bound, at
batch 128 it is bound by reading the KV rings, which is why attention reads only each slot's filled window
and can read fp8 (e4m3) rings with a per-(slot, head, position) fp32 scale.

Layouts (all contiguous):
    qkv      [R, 3 * H * D]        the in_proj output of R rows, q | k | v, each (h d), RoPE pairs interleaved
    q        [R, H, D]             after RoPE
    pools    [P, H, page, D]       per physical page, head and offset (keys and values separately)
    scales   [P, H, page] fp32     only for fp8 pools: stored value * scale = the bf16 key / value
    table    [S, pages_per_slot]   int64: the physical page of each slot's logical page (``ops.KVLayer``)
    windows  [S] int64             each slot's ring length: position p lives at ring position p % windows[slot]
    slot_ids [R] int64             which slot each row belongs to
    pos      [R] int64             this frame's position (= model passes of the slot so far)

This module imports only when Triton is installed; ``ops.py`` falls back to plain torch otherwise.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0  # largest finite float8_e4m3fn
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _rmsnorm_kernel(x_ptr, alpha_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    var = eps + tl.sum(x * x, axis=0) / n_cols
    alpha = tl.load(alpha_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * (alpha * tl.rsqrt(var))  # moshi's order: x * (alpha * rsqrt(var))
    tl.store(out_ptr + row * n_cols + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
    """x [R, N] -> [R, N] in x's dtype; statistics in fp32."""
    R, N = x.shape
    out = torch.empty_like(x)
    block = triton.next_power_of_2(N)
    _rmsnorm_kernel[(R,)](x, alpha, out, N, eps, BLOCK=block, num_warps=8 if block >= 2048 else 4)
    return out


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, hidden, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < hidden
    a = tl.load(x_ptr + row * 2 * hidden + col, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + row * 2 * hidden + hidden + col, mask=mask, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(out_ptr + row * hidden + col, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """x [R, 2h] = [a | b] -> silu(a) * b [R, h]."""
    R, two_h = x.shape
    hidden = two_h // 2
    out = torch.empty((R, hidden), device=x.device, dtype=x.dtype)
    block = 1024
    _silu_mul_kernel[(R, triton.cdiv(hidden, block))](x, out, hidden, BLOCK=block, num_warps=4)
    return out


@triton.jit
def _rope_kv_write_kernel(
    qkv_ptr,
    q_out_ptr,
    k_ring_ptr,
    v_ring_ptr,
    k_scale_ptr,
    v_scale_ptr,
    table_ptr,
    windows_ptr,
    slot_ptr,
    pos_ptr,
    H,
    PAGE,
    PAGES_PER_SLOT,
    log_max_period,
    D: tl.constexpr,
    HALF: tl.constexpr,
    FP8: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + row)
    pos = tl.load(pos_ptr + row)
    ring_pos = pos % tl.load(windows_ptr + slot)
    page = tl.load(table_ptr + slot * PAGES_PER_SLOT + ring_pos // PAGE)
    at = (page * H + head).to(tl.int64) * PAGE + ring_pos % PAGE  # (page, head, offset) in the pool
    i = tl.arange(0, HALF)
    freqs = tl.exp(i.to(tl.float32) * (-log_max_period * 2.0 / D))
    angle = pos.to(tl.float32) * freqs
    cos = tl.cos(angle)
    sin = tl.sin(angle)
    base = qkv_ptr + row * 3 * H * D + head * D
    # q: rotate pairs (2i, 2i+1) in fp32, round to the model dtype (as moshi's apply_rope does)
    qr = tl.load(base + 2 * i).to(tl.float32)
    qi = tl.load(base + 2 * i + 1).to(tl.float32)
    q_dst = q_out_ptr + (row * H + head) * D
    tl.store(q_dst + 2 * i, (qr * cos - qi * sin).to(q_out_ptr.dtype.element_ty))
    tl.store(q_dst + 2 * i + 1, (qr * sin + qi * cos).to(q_out_ptr.dtype.element_ty))
    kr = tl.load(base + H * D + 2 * i).to(tl.float32)
    ki = tl.load(base + H * D + 2 * i + 1).to(tl.float32)
    k0 = (kr * cos - ki * sin).to(qkv_ptr.dtype.element_ty).to(tl.float32)
    k1 = (kr * sin + ki * cos).to(qkv_ptr.dtype.element_ty).to(tl.float32)
    v0 = tl.load(base + 2 * H * D + 2 * i).to(tl.float32)
    v1 = tl.load(base + 2 * H * D + 2 * i + 1).to(tl.float32)
    dst = at * D
    if FP8:
        k_amax = tl.maximum(tl.max(tl.maximum(tl.abs(k0), tl.abs(k1)), axis=0), 1e-12)
        v_amax = tl.maximum(tl.max(tl.maximum(tl.abs(v0), tl.abs(v1)), axis=0), 1e-12)
        k_scale = k_amax / 448.0
        v_scale = v_amax / 448.0
        tl.store(k_scale_ptr + at, k_scale)
        tl.store(v_scale_ptr + at, v_scale)
        k0 = k0 / k_scale
        k1 = k1 / k_scale
        v0 = v0 / v_scale
        v1 = v1 / v_scale
    ty = k_ring_ptr.dtype.element_ty
    tl.store(k_ring_ptr + dst + 2 * i, k0.to(ty))
    tl.store(k_ring_ptr + dst + 2 * i + 1, k1.to(ty))
    tl.store(v_ring_ptr + dst + 2 * i, v0.to(ty))
    tl.store(v_ring_ptr + dst + 2 * i + 1, v1.to(ty))


def rope_kv_write(qkv: torch.Tensor, kv, slot_ids: torch.Tensor, pos: torch.Tensor, max_period: float) -> torch.Tensor:
    """Apply RoPE to q and k of every row, store k and v at ring position ``pos % windows[slot]`` of the slot's
    pages (``kv`` is an ``ops.KVLayer``); return q [R, H, D]."""
    R = qkv.shape[0]
    _, H, P, D = kv.keys.shape
    q = torch.empty((R, H, D), device=qkv.device, dtype=qkv.dtype)
    fp8 = kv.key_scales is not None
    dummy = q  # never read when not fp8
    _rope_kv_write_kernel[(R, H)](
        qkv,
        q,
        kv.keys,
        kv.values,
        kv.key_scales if fp8 else dummy,
        kv.value_scales if fp8 else dummy,
        kv.page_table,
        kv.windows,
        slot_ids,
        pos,
        H,
        P,
        kv.page_table.shape[1],
        math.log(max_period),
        D=D,
        HALF=D // 2,
        FP8=fp8,
        num_warps=1,
    )
    return q


@triton.jit
def _attend_block(
    q,
    k_ring_ptr,
    v_ring_ptr,
    k_scale_ptr,
    v_scale_ptr,
    slot_pages_ptr,
    head,
    H,
    PAGE,
    last_page,
    n0,
    end,
    m_i,
    l_i,
    acc,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
):
    """Online-softmax update with ring positions n0 .. n0 + BLOCK_N - 1 (those below ``end``).

    The block lies inside one page (the launcher checks that blocks divide pages), so one table read
    places it; past the last page (only in the interpreter's static walk) every entry is masked anyway.
    """
    d = tl.arange(0, D)
    j = tl.arange(0, BLOCK_N)
    valid = n0 + j < end
    page = tl.load(slot_pages_ptr + tl.minimum(n0 // PAGE, last_page))
    at = (page * H + head).to(tl.int64) * PAGE + n0 % PAGE + j
    offs = at[:, None] * D + d[None, :]
    k = tl.load(k_ring_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
    v = tl.load(v_ring_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
    if FP8:
        k = k * tl.load(k_scale_ptr + at, mask=valid, other=0.0)[:, None]
        v = v * tl.load(v_scale_ptr + at, mask=valid, other=0.0)[:, None]
    s = tl.sum(k * q[None, :], axis=1)
    s = tl.where(valid, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=0))
    p = tl.exp(s - m_new)
    # a block with no valid entry (only in the interpreter's static walk) must leave the state unchanged
    correction = tl.where(m_new == -float("inf"), 1.0, tl.exp(m_i - m_new))
    p = tl.where(valid, p, 0.0)
    l_i = l_i * correction + tl.sum(p, axis=0)
    acc = acc * correction + tl.sum(p[:, None] * v, axis=0)
    return m_new, l_i, acc


@triton.jit
def _decode_attention_split_kernel(
    q_ptr,
    k_ring_ptr,
    v_ring_ptr,
    k_scale_ptr,
    v_scale_ptr,
    table_ptr,
    slot_ptr,
    len_ptr,
    acc_ptr,
    m_ptr,
    l_ptr,
    H,
    PAGE,
    PAGES_PER_SLOT,
    chunk,
    sm_scale,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FP8: tl.constexpr,
    STATIC_LOOP: tl.constexpr,
    STATIC_ITERS: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    slot = tl.load(slot_ptr + row)
    length = tl.load(len_ptr + row)  # filled ring positions of this slot (<= its window): only these are read
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (row * H + head) * D + d).to(tl.float32) * sm_scale
    slot_pages = table_ptr + slot * PAGES_PER_SLOT
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([D], dtype=tl.float32)
    if STATIC_LOOP:  # the CPU interpreter cannot loop to a loaded bound: walk the whole chunk, masked
        for it in range(STATIC_ITERS):
            m_i, l_i, acc = _attend_block(
                q,
                k_ring_ptr,
                v_ring_ptr,
                k_scale_ptr,
                v_scale_ptr,
                slot_pages,
                head,
                H,
                PAGE,
                PAGES_PER_SLOT - 1,
                start + it * BLOCK_N,
                end,
                m_i,
                l_i,
                acc,
                D,
                BLOCK_N,
                FP8,
            )
    else:  # the GPU stops at the slot's filled length: an empty or short window costs no reads
        for n0 in range(start, end, BLOCK_N):
            m_i, l_i, acc = _attend_block(
                q,
                k_ring_ptr,
                v_ring_ptr,
                k_scale_ptr,
                v_scale_ptr,
                slot_pages,
                head,
                H,
                PAGE,
                PAGES_PER_SLOT - 1,
                n0,
                end,
                m_i,
                l_i,
                acc,
                D,
                BLOCK_N,
                FP8,
            )
    part = (row * H + head) * NUM_SPLITS + split
    tl.store(acc_ptr + part * D + d, acc)
    tl.store(m_ptr + part, m_i)
    tl.store(l_ptr + part, l_i)


@triton.jit
def _decode_attention_combine_kernel(acc_ptr, m_ptr, l_ptr, out_ptr, D: tl.constexpr, NUM_SPLITS: tl.constexpr):
    pid = tl.program_id(0)  # row * H + head
    s = tl.arange(0, NUM_SPLITS)
    m = tl.load(m_ptr + pid * NUM_SPLITS + s)
    l_part = tl.load(l_ptr + pid * NUM_SPLITS + s)
    m_max = tl.max(m, axis=0)
    w = tl.where(m == -float("inf"), 0.0, tl.exp(m - m_max))
    denom = tl.sum(w * l_part, axis=0)
    d = tl.arange(0, D)
    acc = tl.load(acc_ptr + (pid * NUM_SPLITS + s)[:, None] * D + d[None, :])
    out = tl.sum(w[:, None] * acc, axis=0) / denom
    tl.store(out_ptr + pid * D + d, out.to(out_ptr.dtype.element_ty))


def decode_attention(
    q: torch.Tensor,
    kv,
    slot_ids: torch.Tensor,
    lengths: torch.Tensor,
    num_splits: int,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Single-query attention of every row over its slot's first ``lengths[r]`` ring positions (``kv`` is an
    ``ops.KVLayer``: the slot's pages are found through its page table).

    The context is split into ``num_splits`` chunks processed by separate programs (flash-decoding), then
    combined with their log-sum-exp weights, so a batch of 1 still spreads over the whole GPU.

    Raises:
        ValueError: ``block_n`` does not divide the page size (a block must not span two pages).

    Returns:
        [R, H * D] in q's dtype.
    """
    R, H, D = q.shape
    C = kv.window
    P, pages_per_slot = kv.keys.shape[2], kv.page_table.shape[1]
    if pages_per_slot > 1 and P % block_n:
        raise ValueError(f"attention blocks of {block_n} positions do not divide pages of {P}")
    chunk = triton.cdiv(triton.cdiv(C, num_splits), block_n) * block_n
    acc = torch.empty((R * H * num_splits, D), device=q.device, dtype=torch.float32)
    m = torch.empty((R * H * num_splits,), device=q.device, dtype=torch.float32)
    l_sum = torch.empty_like(m)
    fp8 = kv.key_scales is not None
    _decode_attention_split_kernel[(R, H, num_splits)](
        q,
        kv.keys,
        kv.values,
        kv.key_scales if fp8 else q,
        kv.value_scales if fp8 else q,
        kv.page_table,
        slot_ids,
        lengths,
        acc,
        m,
        l_sum,
        H,
        P,
        pages_per_slot,
        chunk,
        1.0 / math.sqrt(D),
        D=D,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        FP8=fp8,
        STATIC_LOOP=_INTERPRETED,
        STATIC_ITERS=chunk // block_n if _INTERPRETED else 0,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    out = torch.empty((R, H * D), device=q.device, dtype=q.dtype)
    _decode_attention_combine_kernel[(R * H,)](acc, m, l_sum, out, D=D, NUM_SPLITS=num_splits, num_warps=1)
    return out


@triton.jit
def _depformer_attention_kernel(
    qkv_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    step,
    H,
    sm_scale,
    D: tl.constexpr,
    STEPS: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, D)
    base = qkv_ptr + row * 3 * H * D + head * D
    q = tl.load(base + d).to(tl.float32)
    k_new = tl.load(base + H * D + d)
    v_new = tl.load(base + 2 * H * D + d)
    cache = (row * H + head) * STEPS * D
    tl.store(k_cache_ptr + cache + step * D + d, k_new)
    tl.store(v_cache_ptr + cache + step * D + d, v_new)
    j = tl.arange(0, STEPS)
    earlier = j < step
    offs = cache + j[:, None] * D + d[None, :]
    k = tl.load(k_cache_ptr + offs, mask=earlier[:, None], other=0.0).to(tl.float32)
    v = tl.load(v_cache_ptr + offs, mask=earlier[:, None], other=0.0).to(tl.float32)
    # this step's own key/value come from registers: no read-after-write through memory inside the program
    is_now = (j == step)[:, None]
    k = tl.where(is_now, k_new.to(tl.float32)[None, :], k)
    v = tl.where(is_now, v_new.to(tl.float32)[None, :], v)
    s = tl.sum(k * q[None, :], axis=1) * sm_scale
    s = tl.where(j <= step, s, -float("inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    out = tl.sum(p[:, None] * v, axis=0) / tl.sum(p, axis=0)
    tl.store(out_ptr + (row * H + head) * D + d, out.to(out_ptr.dtype.element_ty))


def depformer_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, step: int) -> torch.Tensor:
    """Depformer step ``step``: store this step's k/v in the per-frame cache [R, H, STEPS, D], attend to 0..step."""
    R = qkv.shape[0]
    _, H, steps, D = k_cache.shape
    out = torch.empty((R, H * D), device=qkv.device, dtype=qkv.dtype)
    _depformer_attention_kernel[(R, H)](
        qkv,
        k_cache,
        v_cache,
        out,
        step,
        H,
        1.0 / math.sqrt(D),
        D=D,
        STEPS=triton.next_power_of_2(steps),
        num_warps=1,
    )
    return out


@triton.jit
def _embed_add_kernel(base_ptr, table_ptr, token_ptr, out_ptr, base_stride, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    token = tl.load(token_ptr + row)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    base = tl.load(base_ptr + row * base_stride + offs, mask=mask, other=0.0)
    row_of_table = tl.where(token > 0, token, 0)  # other negatives (ungenerated) read row 0
    emb = tl.load(table_ptr + row_of_table * N + offs, mask=mask, other=0.0)
    emb = tl.where(token == -1, 0.0, emb)  # token -1 embeds to exact zero
    total = base.to(tl.float32) + emb.to(tl.float32)  # one rounding, as torch adds bf16
    tl.store(out_ptr + row * N + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


def embed_add(base: torch.Tensor, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """base [R, N] (row stride may exceed N) + table[tokens] [R, N] -> [R, N], one launch."""
    R, N = base.shape
    out = torch.empty((R, N), device=base.device, dtype=base.dtype)
    _embed_add_kernel[(R,)](base, table, tokens, out, base.stride(0), N, BLOCK=triton.next_power_of_2(N), num_warps=4)
    return out


@triton.jit
def _sample_top_k_kernel(
    logits_ptr,
    out_ptr,
    seed_ptr,
    V,
    inv_temp,
    salt,
    TOP_K: tl.constexpr,
    BLOCK: tl.constexpr,
    BISECT: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < V
    x = tl.load(logits_ptr + row * V + offs, mask=mask, other=-float("inf")).to(tl.float32) * inv_temp
    x_max = tl.max(x, axis=0)
    # the k-th largest logit by bisection on the value: keep = the ~top_k candidates (ties may add a few)
    lo = tl.min(tl.where(mask, x, float("inf")), axis=0)
    hi = x_max
    for _ in range(BISECT):
        mid = (lo + hi) * 0.5
        enough = tl.sum((x >= mid).to(tl.int32), axis=0) >= TOP_K
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    keep = mask & (x >= lo)
    p = tl.exp(x - x_max)  # unnormalised softmax: the race below does not need the normaliser
    seed = tl.load(seed_ptr + row)
    u = tl.rand(seed, offs + salt * BLOCK)
    race = p / (-tl.log(tl.maximum(u, 1e-12)))  # exponential race == sampling from the renormalised top-k
    race = tl.where(keep, race, -1.0)
    tl.store(out_ptr + row, tl.argmax(race, axis=0).to(tl.int64))
    tl.store(seed_ptr + row, seed + 1)  # next call of this row draws fresh numbers (stream order)


def sample_top_k(logits: torch.Tensor, temp: float, top_k: int, seeds: torch.Tensor, salt: int) -> torch.Tensor:
    """Sample one token per row from softmax(logits / temp) restricted to the top_k logits, in one launch.

    ``seeds`` [R] int64 lives on the device and is advanced by the kernel itself, so no host sync and no
    extra launch is needed inside a CUDA graph; ``salt`` separates the calls of one step.
    """
    R, V = logits.shape
    out = torch.empty((R,), device=logits.device, dtype=torch.long)
    block = triton.next_power_of_2(V)
    _sample_top_k_kernel[(R,)](
        logits,
        out,
        seeds,
        V,
        1.0 / temp,
        salt,
        TOP_K=min(top_k, V),
        BLOCK=block,
        BISECT=20,
        num_warps=16 if block >= 16384 else 4,
    )
    return out


@triton.jit
def _small_gemv_kernel(
    x_ptr,
    alpha_ptr,
    w_ptr,
    res_ptr,
    out_ptr,
    N,
    x_stride,
    eps,
    K: tl.constexpr,
    K_BLOCKS: tl.constexpr,
    MODE: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    x_row = x_ptr + row * x_stride
    rstd = 1.0
    if MODE == 1:  # RMSNorm prologue: every program recomputes the row's statistics (K is small)
        sq = tl.zeros([BLOCK_K], dtype=tl.float32)
        for kb in range(K_BLOCKS):
            kk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            xv = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)
            sq += xv * xv
        rstd = tl.rsqrt(eps + tl.sum(sq, axis=0) / K)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for kb in range(K_BLOCKS):
        kk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = kk < K
        if MODE == 2:  # SiLU gate prologue: x holds [a | b], the GEMV input is silu(a) * b
            a = tl.load(x_row + kk, mask=k_mask, other=0.0).to(tl.float32)
            b = tl.load(x_row + K + kk, mask=k_mask, other=0.0).to(tl.float32)
            xv = (a / (1.0 + tl.exp(-a)) * b).to(w_ptr.dtype.element_ty).to(tl.float32)
        else:
            xv = tl.load(x_row + kk, mask=k_mask, other=0.0).to(tl.float32)
            if MODE == 1:
                alpha = tl.load(alpha_ptr + kk, mask=k_mask, other=0.0).to(tl.float32)
                xv = (xv * (alpha * rstd)).to(w_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + n[:, None] * K + kk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * xv[None, :], axis=1)
    if RESIDUAL:
        acc += tl.load(res_ptr + row * N + n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def small_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_alpha: torch.Tensor | None = None,
    eps: float = 1e-8,
    gate: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = f(x) @ weight.T (+ residual) for a few rows, in one launch.

    ``f`` is the identity, RMSNorm with gain ``norm_alpha``, or (``gate``) ``silu(a) * b`` of x = [a | b].
    Small batches of the depformer are latency-bound: fusing the norm and the gate into the GEMV removes
    three of the eight launches of a layer.
    """
    R = x.shape[0]
    N, K = weight.shape
    out = torch.empty((R, N), device=x.device, dtype=weight.dtype)
    mode = 2 if gate else (1 if norm_alpha is not None else 0)
    block_n = 16 if N <= 2048 else 32
    _small_gemv_kernel[(triton.cdiv(N, block_n), R)](
        x,
        norm_alpha if norm_alpha is not None else weight,
        weight,
        residual if residual is not None else out,
        out,
        N,
        x.stride(0),
        eps,
        K=K,
        K_BLOCKS=triton.cdiv(K, 256),
        MODE=mode,
        RESIDUAL=residual is not None,
        BLOCK_N=block_n,
        BLOCK_K=256,
        num_warps=4,
    )
    return out
