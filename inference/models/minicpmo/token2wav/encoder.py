"""Token encoder of the Token2Wav flow (CosyVoice 2 ``UpsampleConformerEncoderV2``), streaming only.

25 Hz token embeddings -> linear + LayerNorm (x sqrt(d)) -> a causal look-ahead conv pair -> conformer blocks
with ESPnet relative-position attention -> nearest 2x upsampling and a causal conv -> a second stack of
conformer blocks at 50 Hz -> LayerNorm. Only the chunked path exists here: every call sees the cached keys
and values of all earlier chunks plus its own frames, unmasked (the reference's ``forward_chunk``).

Cache layout (kept as the reference has it, so its truncation rule applies unchanged):
``att`` [blocks + up_blocks, 1, heads, 2 x T25, 2 x d_k] -- the 25 Hz blocks' caches are stored repeated
twice along time so that both stacks share one tensor; ``cnn`` [1, d, 2 + 2 x stride] -- the look-ahead
conv's last 2 frames, then the upsampler's last 2 x stride frames.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from inference.models.minicpmo.token2wav.config import EncoderConfig


def rel_positions(d_model: int, size: int) -> torch.Tensor:
    """ESPnet relative position table [1, 2 x size - 1, d]: positive offsets reversed, then negative ones."""
    position = torch.arange(0, size, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
    pos = torch.zeros(size, d_model)
    neg = torch.zeros(size, d_model)
    pos[:, 0::2] = torch.sin(position * div_term)
    pos[:, 1::2] = torch.cos(position * div_term)
    neg[:, 0::2] = torch.sin(-1 * position * div_term)
    neg[:, 1::2] = torch.cos(-1 * position * div_term)
    return torch.cat([torch.flip(pos, [0]).unsqueeze(0), neg[1:].unsqueeze(0)], dim=1)


class PositionTable:
    """The relative-position table, built once for 5000 positions as the reference does, sliced per call."""

    MAX_LEN = 5000

    def __init__(self, d_model: int):
        self.pe = rel_positions(d_model, self.MAX_LEN)

    def window(self, size: int, like: torch.Tensor) -> torch.Tensor:
        """Offsets ``size - 1 ... -(size - 1)``: [1, 2 x size - 1, d]."""
        if self.pe.device != like.device or self.pe.dtype != like.dtype:
            self.pe = self.pe.to(device=like.device, dtype=like.dtype)
        centre = self.pe.size(1) // 2
        return self.pe[:, centre - size + 1 : centre + size]


class LinearEmbed(nn.Module):
    """``embed.out``: Linear + LayerNorm, then the x sqrt(d) scale of the positional encoding."""

    def __init__(self, idim: int, odim: int):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5))
        self.xscale = math.sqrt(odim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x) * self.xscale


class RelPositionAttention(nn.Module):
    """Transformer-XL style attention (``pos_bias_u`` / ``pos_bias_v``) over cache + chunk, no mask."""

    def __init__(self, heads: int, dim: int, key_bias: bool):
        super().__init__()
        self.h, self.d_k = heads, dim // heads
        self.linear_q = nn.Linear(dim, dim)
        self.linear_k = nn.Linear(dim, dim, bias=key_bias)
        self.linear_v = nn.Linear(dim, dim)
        self.linear_out = nn.Linear(dim, dim)
        self.linear_pos = nn.Linear(dim, dim, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.d_k))

    @staticmethod
    def rel_shift(x: torch.Tensor) -> torch.Tensor:
        """[b, h, t1, 2 t2 - 1] -> [b, h, t1, t2]: the ESPnet padding-and-view trick (kept bit for bit)."""
        b, h, t1, n = x.shape
        padded = torch.cat([x.new_zeros(b, h, t1, 1), x], dim=-1).view(b, h, n + 1, t1)
        return padded[:, :, 1:].view_as(x)[:, :, :, : n // 2 + 1]

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, cache: torch.Tensor | None):
        """x [b, t, d]; pos_emb [1, 2 T - 1, d] with T = cached + t; cache [b, h, cached, 2 d_k] or None."""
        b = x.size(0)
        q = self.linear_q(x).view(b, -1, self.h, self.d_k)  # [b, t, h, dk]
        k = self.linear_k(x).view(b, -1, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, -1, self.h, self.d_k).transpose(1, 2)
        if cache is not None and cache.size(0) > 0:
            k_cache, v_cache = torch.split(cache, cache.size(-1) // 2, dim=-1)
            k = torch.cat([k_cache, k], dim=2)
            v = torch.cat([v_cache, v], dim=2)
        new_cache = torch.cat((k, v), dim=-1)
        p = self.linear_pos(pos_emb).view(pos_emb.size(0), -1, self.h, self.d_k).transpose(1, 2)
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        ac = torch.matmul(q_u, k.transpose(-2, -1))
        bd = torch.matmul(q_v, p.transpose(-2, -1))
        if ac.shape != bd.shape:
            bd = self.rel_shift(bd)
        scores = (ac + bd) / math.sqrt(self.d_k)
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)
        return self.linear_out(out), new_cache


class FeedForward(nn.Module):
    """``w_1`` -> SiLU -> ``w_2``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_1 = nn.Linear(dim, hidden)
        self.w_2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerLayer(nn.Module):
    """Pre-norm attention + feed-forward (no conv module, no macaron: as configured in CosyVoice 2)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        d = cfg.output_size
        self.self_attn = RelPositionAttention(cfg.attention_heads, d, cfg.key_bias)
        self.feed_forward = FeedForward(d, cfg.linear_units)
        self.norm_ff = nn.LayerNorm(d, eps=1e-12)
        self.norm_mha = nn.LayerNorm(d, eps=1e-12)
        self.pre_norm = cfg.normalize_before

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, cache: torch.Tensor | None):
        residual = x
        h = self.norm_mha(x) if self.pre_norm else x
        att, new_cache = self.self_attn(h, pos_emb, cache)
        x = residual + att
        if not self.pre_norm:
            x = self.norm_mha(x)
        residual = x
        h = self.norm_ff(x) if self.pre_norm else x
        x = residual + self.feed_forward(h)
        if not self.pre_norm:
            x = self.norm_ff(x)
        return x, new_cache


class PreLookahead(nn.Module):
    """conv1 over (look-ahead + 1) frames, leaky ReLU, causal conv2 over 3 frames, residual."""

    def __init__(self, channels: int, lookahead: int):
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=3)

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None):
        """x [b, t, c] (its last ``lookahead`` frames are look-ahead only) -> [b, t - lookahead, c]."""
        h = F.leaky_relu(self.conv1(x.transpose(1, 2).contiguous()))
        if cache is None:
            cache = h.new_zeros(h.shape[0], h.shape[1], 2)
        new_cache = h[..., -2:]
        h = self.conv2(torch.cat([cache, h], dim=2)).transpose(1, 2).contiguous()
        return h + x[:, : -self.lookahead], new_cache


class Upsample(nn.Module):
    """Nearest-neighbour x stride, then a causal conv of 2 x stride + 1 taps."""

    def __init__(self, channels: int, stride: int, scale_factor: float):
        super().__init__()
        self.stride = stride
        self.scale_factor = float(scale_factor)
        self.conv = nn.Conv1d(channels, channels, stride * 2 + 1)

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None):
        """x [b, c, t] -> [b, c, stride x t]; cache: the last 2 x stride upsampled frames."""
        up = F.interpolate(x, scale_factor=self.scale_factor, mode="nearest")
        if cache is None:
            cache = x.new_zeros(x.shape[0], x.shape[1], self.stride * 2)
        up = torch.cat([cache, up], dim=2)
        return self.conv(up), up[..., -self.stride * 2 :]


class TokenEncoder(nn.Module):
    """``flow.encoder``: parameter names follow the published ``flow.pt``."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        d = cfg.output_size
        self.cfg = cfg
        self.embed = LinearEmbed(cfg.input_size, d)
        self.pre_lookahead_layer = PreLookahead(d, cfg.pre_lookahead_len)
        self.encoders = nn.ModuleList([ConformerLayer(cfg) for _ in range(cfg.num_blocks)])
        self.up_layer = Upsample(d, cfg.up_stride, cfg.up_scale_factor)
        self.up_embed = LinearEmbed(cfg.input_size, d)
        self.up_encoders = nn.ModuleList([ConformerLayer(cfg) for _ in range(cfg.num_up_blocks)])
        self.after_norm = nn.LayerNorm(d, eps=1e-5)
        self.positions = PositionTable(d)

    def forward_chunk(
        self,
        xs: torch.Tensor,
        *,
        last_chunk: bool,
        cnn_cache: torch.Tensor | None,
        att_cache: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Encode one chunk of embedded tokens [1, t, input_size].

        Returns the 50 Hz features [1, stride x (t - lookahead), d] (all t frames when ``last_chunk``, whose
        look-ahead is zero padding) and the new (cnn, att) caches.
        """
        n1 = len(self.encoders)
        offset = att_cache.shape[3] // 2 if att_cache is not None else 0
        cnn1 = cnn_cache[:, :, :2] if cnn_cache is not None else None
        cnn2 = cnn_cache[:, :, 2:] if cnn_cache is not None else None
        xs = self.embed(xs)
        if last_chunk:
            xs = F.pad(xs, (0, 0, 0, self.cfg.pre_lookahead_len))
        xs, new_cnn1 = self.pre_lookahead_layer(xs, cnn1)
        pos = self.positions.window(offset + xs.shape[1], xs)
        new_att1 = []
        for i, layer in enumerate(self.encoders):
            cache = att_cache[i, :, :, :offset] if att_cache is not None else None
            xs, c = layer(xs, pos, cache)
            new_att1.append(c)
        xs, new_cnn2 = self.up_layer(xs.transpose(1, 2).contiguous(), cnn2)
        xs = self.up_embed(xs.transpose(1, 2).contiguous())
        # The reference takes the 50 Hz table from the first embed too (the tables are identical).
        pos = self.positions.window(offset * self.cfg.up_stride + xs.shape[1], xs)
        new_att2 = []
        for i, layer in enumerate(self.up_encoders):
            cache = att_cache[n1 + i] if att_cache is not None else None
            xs, c = layer(xs, pos, cache)
            new_att2.append(c)
        if self.cfg.normalize_before:
            xs = self.after_norm(xs)
        new_att = torch.cat([torch.stack(new_att1, 0).repeat(1, 1, 1, 2, 1), torch.stack(new_att2, 0)], dim=0)
        return xs, torch.cat([new_cnn1, new_cnn2], dim=2), new_att
