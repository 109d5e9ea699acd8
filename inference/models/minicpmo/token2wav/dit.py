"""Flow-matching estimator of the Token2Wav flow: a DiT (adaLN-zero blocks with attention, a causal conv block
and an MLP), run chunk by chunk with per-block key/value and conv caches, inside a classifier-free-guided
Euler solver on a cosine time schedule (the reference's ``CausalConditionalCFM.forward_chunk``).

Each Euler step of each chunk has its own caches (the estimator sees a different ``x`` at every step), so the
solver's caches are [steps, depth, 2, ...]: the batch of 2 is the conditional and the unconditional half of
classifier-free guidance. Quirk kept from the reference: a chunk's new keys go *before* the cached ones.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from inference.models.minicpmo.token2wav.config import DiTConfig


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class Mlp(nn.Module):
    """fc1 -> tanh-GELU -> fc2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class ChunkAttention(nn.Module):
    """Multi-head attention with LayerNorm on q and k; keys/values of earlier chunks come from the cache."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.q_norm = nn.LayerNorm(head_dim)
        self.k_norm = nn.LayerNorm(head_dim)
        self.proj = nn.Linear(inner, dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        return x.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None):
        """x [b, t, dim]; cache [b, heads, T, 2 head_dim] -> ([b, t, dim], [b, heads, t + T, 2 head_dim])."""
        b, t, _ = x.shape
        q = self.q_norm(self._heads(self.to_q(x)))
        k = self.k_norm(self._heads(self.to_k(x)))
        v = self._heads(self.to_v(x))
        if cache is not None:
            k_cache, v_cache = cache.chunk(2, dim=3)
            k = torch.cat([k, k_cache], dim=2)
            v = torch.cat([v, v_cache], dim=2)
        new_cache = torch.cat([k, v], dim=3)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, t, -1)), new_cache


class CausalConv(nn.Conv1d):
    """A conv whose left context comes from the previous chunk (``kernel - 1`` frames of cache)."""

    def step(self, x: torch.Tensor, cache: torch.Tensor | None):
        pad = self.kernel_size[0] - 1
        if cache is None:
            cache = x.new_zeros(x.shape[0], self.in_channels, pad)
        x = torch.cat([cache, x], dim=2)
        return super().forward(x), x[..., -pad:]


class ConvBlock(nn.Module):
    """``block``: causal conv -> LayerNorm -> Mish -> causal conv (indices 1, 3, 6 as published)."""

    def __init__(self, channels: int, kernel_size: int = 3):
        super().__init__()
        self.channels = channels
        self.block = nn.ModuleDict(
            {
                "1": CausalConv(channels, channels, kernel_size),
                "3": nn.LayerNorm(channels),
                "6": CausalConv(channels, channels, kernel_size),
            }
        )

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None):
        """x [b, t, c]; cache [b, 2c, k - 1] -> ([b, t, c], new cache)."""
        c1, c2 = cache.split((self.channels, self.channels), dim=1) if cache is not None else (None, None)
        h, n1 = self.block["1"].step(x.transpose(1, 2), c1)
        h = F.mish(self.block["3"](h.transpose(1, 2)))
        h, n2 = self.block["6"].step(h.transpose(1, 2), c2)
        return h.transpose(1, 2), torch.cat((n1, n2), dim=1)


class DiTBlock(nn.Module):
    """adaLN-zero block: attention, conv and MLP branches, each gated by the time embedding."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        d = cfg.hidden_size
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.attn = ChunkAttention(d, cfg.num_heads, cfg.head_dim)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(d, int(d * cfg.mlp_ratio))
        self.norm3 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.conv = ConvBlock(d)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(d, 9 * d))

    def forward(self, x: torch.Tensor, c: torch.Tensor, cnn_cache: torch.Tensor | None, att_cache: torch.Tensor | None):
        sh_a, sc_a, g_a, sh_m, sc_m, g_m, sh_c, sc_c, g_c = self.adaLN_modulation(c).chunk(9, dim=-1)
        att, new_att = self.attn(modulate(self.norm1(x), sh_a, sc_a), att_cache)
        x = x + g_a * att
        conv, new_cnn = self.conv(modulate(self.norm3(x), sh_c, sc_c), cnn_cache)
        x = x + g_c * conv
        x = x + g_m * self.mlp(modulate(self.norm2(x), sh_m, sc_m))
        return x, new_cnn, new_att


class TimestepEmbedder(nn.Module):
    """Sinusoidal embedding of 1000 t (cos half first), then a 2-layer SiLU MLP."""

    FREQ_DIM = 256

    def __init__(self, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(self.FREQ_DIM, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.FREQ_DIM // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(start=0, end=half) / half).to(t)
        args = (t * 1000)[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class FinalLayer(nn.Module):
    """adaLN-modulated LayerNorm, then the projection to mel channels."""

    def __init__(self, hidden: int, out_channels: int):
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, out_channels)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    """``flow.decoder.estimator``."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.t_embedder = TimestepEmbedder(cfg.hidden_size)
        self.in_proj = nn.Linear(cfg.in_channels, cfg.hidden_size)
        self.blocks = nn.ModuleList([DiTBlock(cfg) for _ in range(cfg.depth)])
        self.final_layer = FinalLayer(cfg.hidden_size, cfg.out_channels)

    def forward_chunk(self, x, mu, t, spks, cond, cnn_cache, att_cache):
        """x, mu, cond [b, c, t]; t [b]; spks [b, c]; caches [depth, ...] or None.

        Returns (velocity [b, c, t], cnn cache [depth, b, 2 hidden, 2], att cache [depth, b, h, T + t, 2 hd]).
        """
        temb = self.t_embedder(t).unsqueeze(1)
        spks = spks.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        h = self.in_proj(torch.cat([x, mu, spks, cond], dim=1).transpose(1, 2))
        new_cnn, new_att = [], []
        for i, block in enumerate(self.blocks):
            h, c, a = block(
                h,
                temb,
                cnn_cache[i] if cnn_cache is not None else None,
                att_cache[i] if att_cache is not None else None,
            )
            new_cnn.append(c)
            new_att.append(a)
        out = self.final_layer(h, temb).transpose(1, 2)
        return out, torch.stack(new_cnn), torch.stack(new_att)


class ChunkCFM(nn.Module):
    """``flow.decoder``: the guided Euler solver over the DiT, chunk by chunk.

    The starting noise is one fixed [1, mel, 30000] draw (600 s at 50 Hz) read at the chunk's absolute frame
    offset, so a given frame always starts from the same noise whatever the chunking.
    """

    MAX_FRAMES = 50 * 600

    def __init__(self, estimator_cfg: DiTConfig, cfg_rate: float, noise_seed: int):
        super().__init__()
        self.estimator = DiT(estimator_cfg)
        self.cfg_rate = cfg_rate
        gen = torch.Generator().manual_seed(noise_seed)
        noise = torch.randn([1, estimator_cfg.out_channels, self.MAX_FRAMES], generator=gen)
        self.register_buffer("rand_noise", noise, persistent=False)

    def forward_chunk(self, mu, spks, cond, n_timesteps, cnn_cache, att_cache):
        """mu, cond [b, c, t]; spks [b, c]; caches [steps, depth, 2 b, ...] or None -> (mel, cnn, att).

        The estimator's batch is [cond_1 .. cond_b, uncond_1 .. uncond_b], caches included. Every row starts from
        the same noise: the rows of a batch share their offset (their cache length).
        """
        offset = att_cache.shape[4] if att_cache is not None else 0
        x = self.rand_noise[:, :, offset : offset + mu.size(2)].expand(mu.size(0), -1, -1)
        t_span = torch.linspace(0, 1, n_timesteps + 1, device=mu.device, dtype=mu.dtype)
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
        t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
        mu_in = torch.cat([mu, torch.zeros_like(mu)], dim=0)
        spks_in = torch.cat([spks, torch.zeros_like(spks)], dim=0)
        cond_in = torch.cat([cond, torch.zeros_like(cond)], dim=0)
        new_cnn, new_att = [], []
        for step in range(1, len(t_span)):
            v, c, a = self.estimator.forward_chunk(
                x.repeat(2, 1, 1),
                mu_in,
                t.repeat(2 * mu.size(0)),
                spks_in,
                cond_in,
                cnn_cache[step - 1] if cnn_cache is not None else None,
                att_cache[step - 1] if att_cache is not None else None,
            )
            v_cond, v_uncond = v.chunk(2, dim=0)
            x = x + dt * ((1.0 + self.cfg_rate) * v_cond - self.cfg_rate * v_uncond)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
            new_cnn.append(c)
            new_att.append(a)
        return x, torch.stack(new_cnn), torch.stack(new_att)
