"""Row-invariant GEMM, norms and attention (Triton): a row's result is the same bits whatever else is in the batch.

cuBLAS and torch's own reductions pick their kernel, tiling and split of the reduction by the whole problem's
shape, so one session's row computed alone (the eager path: one session, its own feed lengths) and the same row
computed as one of sixteen sessions in a padded, graphed step (the fast path) round differently, and at a
near-tie the greedy id differs. Here every reduction has one order that depends only on the reduced length:

- ``linear``: the input dimension is cut into ``SPLIT_K`` pieces; each piece is one ``tl.dot`` chain over
  ``BLOCK_K`` steps, and the pieces are added in order. Whether the pieces run as programs of their own
  (few output tiles: a decode step needs the parallelism) or in a loop of one program (many tiles) changes
  where the additions run, not what they add. Output tiles never mix rows or columns.
- ``rms_norm`` / ``layer_norm``: one program per row, a fixed block over the row.
- ``attention``: keys in fixed ``SPLIT_KEYS`` slices from position 0, each a running softmax over ``BLOCK_N``
  blocks; the slices merge in order. A longer key bucket only adds slices of exact zeros, keys past a
  query's visible length add exact zeros, so a row sees the same arithmetic in a 15-position prefill of its
  own and in a padded 16-row graph. Those zeros are never stored or read: a slice's partials travel through
  memory only for the query rows that see a key in it (a decode step's bucket is set by its oldest call).

Float32 inputs use exact float32 products (no TF32), so the float32 GPU tests still compare with the goldens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT_K = 512  # input positions per partial sum of a GEMM
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64
WIDE_FROM_ROWS = 256  # from this many rows, output tiles of WIDE_M x WIDE_N (same K order: tests/gpu checks bits)
WIDE_M, WIDE_N = 64, 128
LOOP_FROM_TILES = 256  # output tiles from which one program adds its pieces itself (enough programs already)
SPLIT_KEYS = 256  # keys per attention slice
ATTN_BLOCK_Q, ATTN_BLOCK_N = 16, 64


@triton.jit
def _piece_dot(X, W, rm, rn, M, N, K, stride_xm, stride_wn, k_start, SPLIT: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, SPLIT, BK):
        kk = k_start + k0 + tl.arange(0, BK)
        a = tl.load(X + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(W + rn[None, :] * stride_wn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _store_tile(total, Bias, Out, rm, rn, M, N, stride_om, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        total = total + tl.load(Bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    keep = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(Out + rm[:, None] * stride_om + rn[None, :], total.to(Out.dtype.element_ty), mask=keep)


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(X, W, Bias, Out, Partial, M, N, K, stride_xm, stride_wn, stride_om,
                   N_PIECES: tl.constexpr, HAS_BIAS: tl.constexpr, LOOP: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rm = tl.program_id(1) * BM + tl.arange(0, BM)
    if LOOP:
        total = tl.zeros((BM, BN), tl.float32)
        for p in range(N_PIECES):
            total += _piece_dot(X, W, rm, rn, M, N, K, stride_xm, stride_wn, p * SPLIT, SPLIT, BM, BN, BK, IEEE)
        _store_tile(total, Bias, Out, rm, rn, M, N, stride_om, HAS_BIAS)
    else:
        p = tl.program_id(2)
        part = _piece_dot(X, W, rm, rn, M, N, K, stride_xm, stride_wn, p * SPLIT, SPLIT, BM, BN, BK, IEEE)
        keep = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(Partial + (p * M + rm[:, None]) * N + rn[None, :], part, mask=keep)


@triton.jit(do_not_specialize=["M"])
def _sum_pieces_kernel(Partial, Bias, Out, M, N, stride_om, N_PIECES: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr):  # fmt: skip
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rm = tl.program_id(1) * BM + tl.arange(0, BM)
    keep = (rm[:, None] < M) & (rn[None, :] < N)
    total = tl.zeros((BM, BN), tl.float32)
    for p in range(N_PIECES):
        total += tl.load(Partial + (p * M + rm[:, None]) * N + rn[None, :], mask=keep, other=0.0)
    _store_tile(total, Bias, Out, rm, rn, M, N, stride_om, HAS_BIAS)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with a row-invariant reduction: x [..., K], weight [N, K] -> [..., N] in x's dtype."""
    K = x.shape[-1]
    N = weight.shape[0]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    M = x2.shape[0]
    out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M == 0:
        return out.view(*x.shape[:-1], N)
    n_pieces = triton.cdiv(K, SPLIT_K)
    bm, bn = (WIDE_M, WIDE_N) if M >= WIDE_FROM_ROWS else (BLOCK_M, BLOCK_N)
    tiles = (triton.cdiv(N, bn), triton.cdiv(M, bm))
    loop = n_pieces == 1 or tiles[0] * tiles[1] >= LOOP_FROM_TILES
    partial = out if loop else torch.empty(n_pieces, M, N, device=x.device, dtype=torch.float32)
    has_bias = bias is not None
    common = dict(HAS_BIAS=has_bias, BM=bm, BN=bn)
    _linear_kernel[(*tiles, 1 if loop else n_pieces)](
        x2, weight, bias if has_bias else out, out, partial, M, N, K, x2.stride(0), weight.stride(0), out.stride(0),
        N_PIECES=n_pieces, LOOP=loop, IEEE=x.dtype == torch.float32, SPLIT=SPLIT_K, BK=BLOCK_K, num_warps=4, num_stages=3,
        **common,
    )  # fmt: skip
    if not loop:
        _sum_pieces_kernel[tiles](
            partial, bias if has_bias else out, out, M, N, out.stride(0), N_PIECES=n_pieces, **common
        )
    return out.view(*x.shape[:-1], N)


@triton.jit
def _rms_norm_kernel(X, W, Out, inner, stride_outer, stride_inner, D, eps, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    keep = cols < D
    base = (row // inner) * stride_outer + (row % inner) * stride_inner
    x = tl.load(X + base + cols, mask=keep, other=0.0)
    xf = x.to(tl.float32)
    variance = tl.sum(xf * xf, 0) / D
    normed = (xf * tl.math.rsqrt(variance + eps)).to(x.dtype)  # the cast back before the weight, as the modules do
    w = tl.load(W + cols, mask=keep, other=0.0)
    tl.store(Out + row * D + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(Out.dtype.element_ty), mask=keep)


def _rows_of(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """x [..., D] as [outer, inner, D] rows with two strides (a column slice of a wider tensor stays a view)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        x3 = x.view(1, 1, -1)
    elif x.dim() == 2:
        x3 = x.unsqueeze(0)
    else:
        x3 = x.flatten(0, -3)
    return x3, x3.shape[1], x3.stride(0), x3.stride(1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 / Llama RMSNorm (float32 statistics, cast back, then the weight) over the last dim: a new tensor."""
    D = x.shape[-1]
    rows, inner, s_outer, s_inner = _rows_of(x)
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    n = out.numel() // D
    if n:
        _rms_norm_kernel[(n,)](rows, weight, out, max(inner, 1), s_outer, s_inner, D, eps,
                               BLOCK_D=triton.next_power_of_2(D))  # fmt: skip
    return out


@triton.jit
def _layer_norm_kernel(X, W, B, Out, D, eps, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    keep = cols < D
    x = tl.load(X + row * D + cols, mask=keep, other=0.0).to(tl.float32)
    mean = tl.sum(x, 0) / D
    centred = tl.where(keep, x - mean, 0.0)
    variance = tl.sum(centred * centred, 0) / D
    w = tl.load(W + cols, mask=keep, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=keep, other=0.0).to(tl.float32)
    y = centred * tl.math.rsqrt(variance + eps) * w + b
    tl.store(Out + row * D + cols, y.to(Out.dtype.element_ty), mask=keep)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim (statistics and affine in float32, one rounding): a new tensor."""
    D = x.shape[-1]
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel() // D
    if n:
        _layer_norm_kernel[(n,)](x, weight, bias, out, D, eps, BLOCK_D=triton.next_power_of_2(D))
    return out


@triton.jit
def _attention_slice_kernel(
    Q, K, V, Slots, Starts, Acc, Stats,
    stride_qr, stride_qh, stride_qt,
    stride_ks, stride_kh, stride_kc, stride_vs, stride_vh, stride_vc,
    kv_heads, T, rows_q, scale,
    G: tl.constexpr, HD: tl.constexpr, CAUSAL: tl.constexpr, SLICE: tl.constexpr,
    BQ: tl.constexpr, BN: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    rh = tl.program_id(0)  # row * kv_heads + kv head
    qb = tl.program_id(1)
    s = tl.program_id(2)
    r = rh // kv_heads
    h = rh % kv_heads
    slot = tl.load(Slots + r)
    start = tl.load(Starts + r)
    i = qb * BQ + tl.arange(0, BQ)  # query rows of this KV head: (group g, position t) = (i // T, i % T)
    real = i < rows_q
    g = i // T
    t = i % T
    d = tl.arange(0, HD)
    q_rows = Q + r * stride_qr + (h * G + g) * stride_qh + t * stride_qt
    q = tl.load(q_rows[:, None] + d[None, :], mask=real[:, None], other=0.0)
    if CAUSAL:
        length = start + t + 1
    else:
        length = start + T + t * 0
    length = tl.where(real, length, 0)
    lo = s * SLICE
    hi = tl.minimum(lo + SLICE, tl.max(length, 0))
    m = tl.full([BQ], float("-inf"), tl.float32)
    total = tl.zeros([BQ], tl.float32)
    acc = tl.zeros([BQ, HD], tl.float32)
    k_base = K + slot * stride_ks + h * stride_kh
    v_base = V + slot * stride_vs + h * stride_vh
    for step in range(SLICE // BN):  # a fixed count (blocks past hi load nothing and add exact zeros)
        cols = lo + step * BN + tl.arange(0, BN)
        present = cols < hi
        k = tl.load(k_base + cols[:, None] * stride_kc + d[None, :], mask=present[:, None], other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = tl.where(cols[None, :] < length[:, None], scores * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key in this slice yet
        p = tl.exp(scores - m_safe[:, None])
        rescale = tl.exp(m - m_safe)
        total = total * rescale + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * stride_vc + d[None, :], mask=present[:, None], other=0.0)
        if IEEE:
            acc = acc * rescale[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    # Only rows that see a key of this slice store their partials; the merge reads only those (see there).
    holds = real & (lo < length)
    rows_total = tl.num_programs(1) * BQ
    at = (s * tl.num_programs(0) + rh) * rows_total + i
    tl.store(Acc + at[:, None] * HD + d[None, :], acc, mask=holds[:, None])
    tl.store(Stats + at * 2, m, mask=holds)
    tl.store(Stats + at * 2 + 1, total, mask=holds)


@triton.jit
def _attention_merge_kernel(
    Acc, Stats, Out, Starts, kv_heads, T, rows_q,
    N_SLICES: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, BQ: tl.constexpr, CAUSAL: tl.constexpr,
    SLICE: tl.constexpr,
):  # fmt: skip
    rh = tl.program_id(0)
    qb = tl.program_id(1)
    r = rh // kv_heads
    h = rh % kv_heads
    i = qb * BQ + tl.arange(0, BQ)
    real = i < rows_q
    g = i // T
    t = i % T
    start = tl.load(Starts + r)
    if CAUSAL:
        length = start + t + 1
    else:
        length = start + T + t * 0
    d = tl.arange(0, HD)
    rows_total = tl.num_programs(1) * BQ
    # A slice past a row's visible keys stored nothing for it (its partials would be exactly m = -inf, total 0,
    # acc 0): the masked loads read those same values without touching memory, so the sums below are the bits
    # they always were, and a decode step moves partials only for the slices that hold keys.
    m = tl.full([BQ], float("-inf"), tl.float32)
    for s in range(N_SLICES):
        holds = real & (s * SLICE < length)
        at = (s * tl.num_programs(0) + rh) * rows_total + i
        m = tl.maximum(m, tl.load(Stats + at * 2, mask=holds, other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BQ], tl.float32)
    acc = tl.zeros([BQ, HD], tl.float32)
    for s in range(N_SLICES):
        holds = real & (s * SLICE < length)
        at = (s * tl.num_programs(0) + rh) * rows_total + i
        weight = tl.exp(tl.load(Stats + at * 2, mask=holds, other=float("-inf")) - m)  # no keys: exactly 0
        total += weight * tl.load(Stats + at * 2 + 1, mask=holds, other=0.0)
        acc += weight[:, None] * tl.load(Acc + at[:, None] * HD + d[None, :], mask=holds[:, None], other=0.0)
    total = tl.where(real, total, 1.0)
    heads = kv_heads * G
    out_rows = Out + ((r * T + t) * heads + h * G + g) * HD
    tl.store(out_rows[:, None] + d[None, :], (acc / total[:, None]).to(Out.dtype.element_ty), mask=real[:, None])


def attention(
    q: torch.Tensor,  # [R, H, T, hd]: queries of R rows, T positions each (any strides but hd's)
    keys: torch.Tensor,  # [S, H_kv, C, hd]: a KV pool (or a cache as one slot); hd contiguous
    values: torch.Tensor,
    slots: torch.Tensor,  # [R] long: the slot each row reads
    starts: torch.Tensor,  # [R] long: the position of each row's first query
    kv_len: int,  # an upper bound of the keys any query sees
    scale: float,
    *,
    causal: bool,
) -> torch.Tensor:
    """softmax(q k^T * scale) v, [R, T, H, hd] in q's dtype. Query t of row r sees keys 0 .. start + t (causal)
    or 0 .. start + T - 1 (not causal); grouped query heads share their KV head (H = groups x H_kv)."""
    R, H, T, hd = q.shape
    kv_heads = keys.shape[1]
    groups = H // kv_heads
    if q.stride(-1) != 1:
        q = q.contiguous()
    if keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("keys and values must be contiguous in the head dimension")
    rows_q = groups * T
    q_blocks = triton.cdiv(rows_q, ATTN_BLOCK_Q)
    n_slices = max(1, triton.cdiv(kv_len, SPLIT_KEYS))
    acc = torch.empty(n_slices, R * kv_heads, q_blocks * ATTN_BLOCK_Q, hd, device=q.device, dtype=torch.float32)
    stats = torch.empty(n_slices, R * kv_heads, q_blocks * ATTN_BLOCK_Q, 2, device=q.device, dtype=torch.float32)
    out = torch.empty(R, T, H, hd, device=q.device, dtype=q.dtype)
    if R == 0:
        return out
    _attention_slice_kernel[(R * kv_heads, q_blocks, n_slices)](
        q, keys, values, slots, starts, acc, stats,
        q.stride(0), q.stride(1), q.stride(2),
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        kv_heads, T, rows_q, scale,
        G=groups, HD=hd, CAUSAL=causal, SLICE=SPLIT_KEYS, BQ=ATTN_BLOCK_Q, BN=ATTN_BLOCK_N,
        IEEE=q.dtype == torch.float32,
    )  # fmt: skip
    _attention_merge_kernel[(R * kv_heads, q_blocks)](
        acc, stats, out, starts, kv_heads, T, rows_q,
        N_SLICES=n_slices, G=groups, HD=hd, BQ=ATTN_BLOCK_Q, CAUSAL=causal, SLICE=SPLIT_KEYS,
    )  # fmt: skip
    return out


class RowOps:
    """The reductions of ``fast.decoder.decoder_layer`` (``TorchRowOps``' interface) as these kernels."""

    linear = staticmethod(linear)
    rms_norm = staticmethod(rms_norm)

    @staticmethod
    def attend(q, keys, values, slot_ids, starts, kv_len, scale, groups):
        return attention(q, keys, values, slot_ids, starts, kv_len, scale, causal=True)
