"""The fast path's forward pass over a set of *rows*, each row one slot of a shared per-slot state.

``FastLM`` borrows the weights of a ``MoshiLM`` (no copy except the stacked ``depformer_in``) and computes one
frame for R rows: temporal transformer over each row's slot KV ring, text head, and the depformer's dep_q
sequential codebooks. It owns no per-session state: the KV rings live in ``SlotKV`` and are addressed by
``slot_ids``, so the same captured graph serves any set of slots (a join or a leave changes only the ids).

Kernel count matters more than FLOPs at small batch (the depformer alone is 16 x 6 layers), so every layer is
norm -> GEMM -> fused kernel -> GEMM-with-residual (``addmm``), and the 16 ``depformer_in`` projections are one
GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.models.moshi.config import LMConfig
from inference.models.moshi.fast import ops
from inference.models.moshi.fast.kv import SlotKV
from inference.models.moshi.lm import MoshiLM


@dataclass
class TemporalLayerWeights:
    """One temporal layer: in_proj [3d, d], out_proj [d, d], gating in [2h, d] / out [d, h], norm gains [d]."""

    in_proj: torch.Tensor
    out_proj_t: torch.Tensor  # [d, d] transposed view, for addmm
    norm1: torch.Tensor
    norm2: torch.Tensor
    gate_in: torch.Tensor
    gate_out_t: torch.Tensor  # [h, d] transposed view


@dataclass
class DepformerStepWeights:
    """The weights of depformer layer ``j`` at codebook step ``k``."""

    in_proj: torch.Tensor  # [3 dd, dd]
    out_proj_t: torch.Tensor  # [dd, dd]
    gate_in: torch.Tensor  # [2 hd, dd]
    gate_out_t: torch.Tensor  # [hd, dd]


class FastLM:
    """Row-batched forward of a Moshi-family LM with the fused kernels of ``ops``.

    Args:
        lm: the loaded model whose parameters are borrowed (same device and dtype are used).
    Attributes:
        fused_gemv_max_rows: depformer batches of at most this many rows run the fused small-GEMV kernels on
            CUDA; 0 (the default) uses cuBLAS for every batch size, which measured faster.
        attention_launch: per bucket size, how the decode attention kernel is launched; buckets not in the
            map use ``default_attention_launch`` (``tuning.tune_attention`` fills it at warm-up).
    """

    def __init__(self, lm: MoshiLM):
        c: LMConfig = lm.config
        self.config = c
        self.device = lm.text_emb.weight.device
        self.dtype = lm.text_emb.weight.dtype
        self.eps = 1e-8 if c.norm == "rms_norm_f32" else 1e-5
        self.attention_launch: dict[int, ops.AttentionLaunch] = {}
        # Off: measured on the H200 the fused small-GEMV kernels made the B=1 depformer slower (6.3 ms of kernel
        # time against cuBLAS's ~3 ms; too few programs per GEMV to hide load latency). Kept for a split-K retry.
        self.fused_gemv_max_rows = 0
        # embeddings: one flat table for the n_q audio streams so the column embedding is one gather
        self.audio_emb = torch.cat([e.weight for e in lm.emb], dim=0)  # [n_q * (card+1), d]
        self.text_emb = lm.text_emb.weight  # [text_card+1, d]
        self.emb_offsets = torch.arange(c.n_q, device=self.device, dtype=torch.long) * (c.card + 1)
        self.layers = [
            TemporalLayerWeights(
                in_proj=layer.self_attn.in_proj_weight,
                out_proj_t=layer.self_attn.out_proj.weight.t(),
                norm1=layer.norm1.alpha.view(-1),
                norm2=layer.norm2.alpha.view(-1),
                gate_in=layer.gating.linear_in.weight,
                gate_out_t=layer.gating.linear_out.weight.t(),
            )
            for layer in lm.transformer.layers
        ]
        self.out_norm = lm.out_norm.alpha.view(-1)
        self.text_linear = lm.text_linear.weight  # [text_card, d]
        dd = c.depformer_dim
        self.depformer_in = torch.cat([lin.weight for lin in lm.depformer_in], dim=0)  # [dep_q * dd, d]
        self.depformer_text_emb = lm.depformer_text_emb.weight
        self.depformer_emb = [e.weight for e in lm.depformer_emb]
        self.dep_norms = [(layer.norm1.alpha.view(-1), layer.norm2.alpha.view(-1)) for layer in lm.depformer.layers]
        self.dep_steps = [
            [
                DepformerStepWeights(
                    in_proj=layer.self_attn.in_proj_weight[k * 3 * dd : (k + 1) * 3 * dd],
                    out_proj_t=layer.self_attn.out_proj.weight[k * dd : (k + 1) * dd].t(),
                    gate_in=layer.gating[k].linear_in.weight,
                    gate_out_t=layer.gating[k].linear_out.weight.t(),
                )
                for layer in lm.depformer.layers
            ]
            for k in range(c.dep_q)
        ]
        self.linears = [lin.weight for lin in lm.linears]  # dep_q x [card, dd]
        self.dep_steps_capacity = 1 << max(c.dep_q - 1, 0).bit_length()  # power of two for the kernel

    # ---- pieces ------------------------------------------------------------------------------------

    def embed_column(self, column: torch.Tensor) -> torch.Tensor:
        """column [R, 1 + n_q] tokens -> [R, d]: audio embeddings summed in stream order, then + text.

        Token -1 embeds to exact zero; other negatives clamp to row 0 (moshi ``ScaledEmbedding``).
        """
        audio = column[:, 1:]
        idx = audio.clamp(min=0) + self.emb_offsets.view(1, -1)
        e = self.audio_emb[idx]  # [R, n_q, d]
        e = torch.where((audio == -1)[..., None], torch.zeros((), dtype=e.dtype, device=e.device), e)
        x = e[:, 0]
        for k in range(1, e.shape[1]):  # sequential sum: the same rounding as moshi's running sum
            x = x + e[:, k]
        text = column[:, 0]
        t = self.text_emb[text.clamp(min=0)]
        t = torch.where((text == -1)[:, None], torch.zeros((), dtype=t.dtype, device=t.device), t)
        return x + t

    def temporal(self, x: torch.Tensor, kv: SlotKV, slot_ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [R, d] at positions pos [R] -> hidden [R, d] after ``out_norm``; writes each layer's k/v."""
        c = self.config
        lengths = torch.minimum(pos + 1, kv.windows[slot_ids])
        R = x.shape[0]
        paged = kv.page_table.shape[1] > 1
        launch = self.attention_launch.get(R) or default_attention_launch(
            R, c.num_heads, kv.page_size if paged else None
        )
        for i, w in enumerate(self.layers):
            h = ops.rmsnorm(x, w.norm1, self.eps)
            qkv = h @ w.in_proj.t()  # [R, 3d]
            layer = kv.layer(i)
            q = ops.rope_kv_write(qkv, layer, slot_ids, pos, c.max_period)
            attn = ops.decode_attention(q, layer, slot_ids, lengths, launch)
            x = torch.addmm(x, attn, w.out_proj_t)
            h = ops.rmsnorm(x, w.norm2, self.eps)
            x = torch.addmm(x, ops.silu_mul(h @ w.gate_in.t()), w.gate_out_t)
        return ops.rmsnorm(x, self.out_norm, self.eps)

    def text_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.text_linear.t()  # [R, text_card]

    def depformer_inputs(self, hidden: torch.Tensor) -> torch.Tensor:
        """All dep_q input projections of the frame at once: [R, dep_q, dd]."""
        R = hidden.shape[0]
        return (hidden @ self.depformer_in.t()).view(R, self.config.dep_q, -1)

    def depformer_step(
        self, k: int, dep_in: torch.Tensor, token: torch.Tensor, k_cache: list, v_cache: list
    ) -> torch.Tensor:
        """Codebook step k: projected hidden dep_in [R, dd] + embedding of token [R] -> logits [R, card]."""
        table = self.depformer_text_emb if k == 0 else self.depformer_emb[k - 1]
        x = ops.embed_add(dep_in, table, token)
        fused = ops.use_triton(x) and x.shape[0] <= self.fused_gemv_max_rows
        for j, w in enumerate(self.dep_steps[k]):
            norm1, norm2 = self.dep_norms[j]
            if fused:  # 5 launches per layer instead of 8: norm and gate folded into the GEMVs
                qkv = ops.small_gemv(x, w.in_proj, norm_alpha=norm1, eps=self.eps)
                attn = ops.depformer_attention(qkv, k_cache[j], v_cache[j], k)
                x = ops.small_gemv(attn, w.out_proj_t.t(), residual=x)
                h = ops.small_gemv(x, w.gate_in, norm_alpha=norm2, eps=self.eps)
                x = ops.small_gemv(h, w.gate_out_t.t(), gate=True, residual=x)
                continue
            h = ops.rmsnorm(x, norm1, self.eps)
            attn = ops.depformer_attention(h @ w.in_proj.t(), k_cache[j], v_cache[j], k)
            x = torch.addmm(x, attn, w.out_proj_t)
            h = ops.rmsnorm(x, norm2, self.eps)
            x = torch.addmm(x, ops.silu_mul(h @ w.gate_in.t()), w.gate_out_t)
        return x @ self.linears[k].t()

    def allocate_depformer_cache(self, rows: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-frame depformer k/v for ``rows`` rows: per layer [rows, heads, steps_capacity, head_dim]."""
        c = self.config
        shape = (rows, c.depformer_num_heads, self.dep_steps_capacity, c.depformer_dim // c.depformer_num_heads)
        n = c.depformer_num_layers
        keys = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in range(n)]
        values = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in range(n)]
        return keys, values


def default_attention_launch(
    rows: int, heads: int, page_size: int | None = None, target_programs: int = 2048
) -> ops.AttentionLaunch:
    """Power-of-two context splits so that rows x heads x splits is about ``target_programs`` (1..32); with
    pages (``page_size``), a block size that divides a page."""
    splits = 1
    while splits < 32 and rows * heads * splits * 2 <= target_programs:
        splits *= 2
    block = ops.AttentionLaunch().block_n
    while page_size is not None and page_size % block:
        block //= 2
    return ops.AttentionLaunch(splits=splits, block_n=block)
