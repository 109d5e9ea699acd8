"""Decode-step attention that reads each row's keys and values in place in the KV pool (Triton, CUDA only).

A one-token step's attention, as plain torch ops, is a gather of every row's slot (a copy of its keys and
values up to the KV bucket) and a tiled SDPA kernel built for long queries; on an H200 at 1024 positions the
two took ~33 us of a Qwen3-8B layer's ~165, and with 16 rows at 4096 positions the gather alone dominated
the step. Here each program reads one slice of one row's slot directly (the slot id is data, so one CUDA
graph still serves any mix of sessions) for all the query heads that share a KV head, keeps a running
softmax (flash-decoding), and a second kernel merges the slices.

``decode_attention`` is a torch custom op, so that compiled layers (``RowDecoder(compile_steps=True)``) treat
it as one opaque kernel. Float32 inputs use exact float32 products (no TF32): the float32 GPU tests compare
tokens with the goldens.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # keys per inner iteration
TARGET_PROGRAMS = 264  # about two per multiprocessor of an H100 / H200 (132)


@triton.jit
def _slice_kernel(
    Q,  # [R, H_kv, G, HD]
    K,  # [S, H_kv, C, HD]
    V,
    Slots,  # [R] int64
    Lengths,  # [R] int64: keys visible to the row (positions 0 .. length - 1)
    Acc,  # [R, H_kv, N_SPLITS, G, HD] float32: unnormalised output of each slice
    Stats,  # [R, H_kv, N_SPLITS, G, 2] float32: running max and sum of each slice
    stride_qr,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_kc,
    n_splits,
    scale,
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HD: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
    IEEE: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    slot = tl.load(Slots + r)
    length = tl.load(Lengths + r)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HD)
    q = tl.load(Q + r * stride_qr + h * stride_qh + g[:, None] * HD + d[None, :], mask=g[:, None] < G, other=0.0)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HD], tl.float32)
    k_base = K + slot * stride_ks + h * stride_kh
    v_base = V + slot * stride_ks + h * stride_kh
    for offset in range(0, SPLIT, BLOCK):
        cols = s * SPLIT + offset + tl.arange(0, BLOCK)
        valid = cols < length
        k = tl.load(k_base + cols[:, None] * stride_kc + d[None, :], mask=valid[:, None], other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = tl.where(valid[None, :], scores * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a slice with no visible key yet
        p = tl.exp(scores - m_safe[:, None])
        rescale = tl.exp(m - m_safe)
        total = total * rescale + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * stride_kc + d[None, :], mask=valid[:, None], other=0.0)
        if IEEE:
            acc = acc * rescale[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    row = (r * tl.num_programs(1) + h) * n_splits + s
    keep = g < G
    tl.store(Acc + row * G * HD + g[:, None] * HD + d[None, :], acc, mask=keep[:, None])
    tl.store(Stats + row * G * 2 + g * 2, m, mask=keep)
    tl.store(Stats + row * G * 2 + g * 2 + 1, total, mask=keep)


@triton.jit
def _merge_kernel(
    Acc,
    Stats,
    Out,  # [R, H_kv, G, HD]
    n_splits: tl.constexpr,
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HD: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HD)
    keep = g < G
    first = (r * tl.num_programs(1) + h) * n_splits
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    for s in range(0, n_splits):
        m = tl.maximum(m, tl.load(Stats + (first + s) * G * 2 + g * 2, mask=keep, other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HD], tl.float32)
    for s in range(0, n_splits):
        row = first + s
        weight = tl.exp(tl.load(Stats + row * G * 2 + g * 2, mask=keep, other=float("-inf")) - m)
        total += weight * tl.load(Stats + row * G * 2 + g * 2 + 1, mask=keep, other=0.0)
        part = tl.load(Acc + row * G * HD + g[:, None] * HD + d[None, :], mask=keep[:, None], other=0.0)
        acc += weight[:, None] * part
    total = tl.where(keep, total, 1.0)
    out = acc / total[:, None]
    base = Out + (r * tl.num_programs(1) + h) * G * HD
    tl.store(base + g[:, None] * HD + d[None, :], out.to(Out.dtype.element_ty), mask=keep[:, None])


def split_of(rows: int, kv_heads: int, kv_len: int) -> int:
    """Keys per program: enough programs to fill the GPU, at least one block of keys each."""
    blocks = math.ceil(kv_len / BLOCK_N)
    want = max(1, min(blocks, math.ceil(TARGET_PROGRAMS / (rows * kv_heads))))
    return math.ceil(blocks / want) * BLOCK_N


@torch.library.custom_op("parley::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor,  # [R, H_kv, G, hd]: one position's queries, grouped by the KV head they read
    keys: torch.Tensor,  # [S, H_kv, C, hd]: one layer's pool
    values: torch.Tensor,
    slot_ids: torch.Tensor,  # [R] long
    lengths: torch.Tensor,  # [R] long: keys 0 .. lengths[r] - 1 of the row's slot are visible
    kv_len: int,  # an upper bound of every length (the step's KV bucket)
    scale: float,
) -> torch.Tensor:
    """softmax(q k^T * scale) v over each row's visible keys, read in place: [R, H_kv, G, hd] in q's dtype."""
    q = q.contiguous()
    rows, kv_heads, groups, head_dim = q.shape
    if keys.stride(-1) != 1 or keys.stride() != values.stride():
        raise ValueError("keys and values must share one contiguous layout")
    split = split_of(rows, kv_heads, kv_len)
    n_splits = math.ceil(kv_len / split)
    acc = torch.empty(rows, kv_heads, n_splits, groups, head_dim, device=q.device, dtype=torch.float32)
    stats = torch.empty(rows, kv_heads, n_splits, groups, 2, device=q.device, dtype=torch.float32)
    out = torch.empty_like(q)
    block_g = max(16, triton.next_power_of_2(groups))  # tl.dot wants at least 16 rows
    _slice_kernel[(rows, kv_heads, n_splits)](
        q,
        keys,
        values,
        slot_ids,
        lengths,
        acc,
        stats,
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        n_splits,
        scale,
        G=groups,
        BLOCK_G=block_g,
        HD=head_dim,
        SPLIT=split,
        BLOCK=BLOCK_N,
        IEEE=q.dtype == torch.float32,
    )
    _merge_kernel[(rows, kv_heads)](acc, stats, out, n_splits, G=groups, BLOCK_G=block_g, HD=head_dim)
    return out


@decode_attention.register_fake
def _(q, keys, values, slot_ids, lengths, kv_len, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)
