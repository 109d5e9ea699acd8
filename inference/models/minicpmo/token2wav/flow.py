"""The Token2Wav flow decoder (``flow.pt``): 25 Hz speech tokens + speaker embedding -> 50 Hz 80-bin mel,
streamed chunk by chunk on top of the voice prompt's caches.

``setup`` runs the prompt tokens (plus 3 silence tokens of look-ahead) and the prompt mel through the encoder
and the solver once, which fills the caches a session starts from; ``chunk`` then turns each chunk of new
tokens (ending in ``pre_lookahead_len`` look-ahead tokens unless it is the last) into mel frames.
``FlowCache`` is one session's state; the model itself holds no per-session state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from inference.models.minicpmo.token2wav.config import FlowConfig
from inference.models.minicpmo.token2wav.dit import ChunkCFM
from inference.models.minicpmo.token2wav.encoder import TokenEncoder

NOISE_SEED = 0  # the reference draws its noise from the unseeded global RNG; a fixed seed makes runs repeatable
KEEP_RECENT = 100  # frames of recent context the reference keeps beyond the prompt once a cache grows past it


@dataclass
class FlowCache:
    """One session's flow caches (the reference's ``stream_cache`` dict, same layouts), or a batch's (``batch``)."""

    conformer_cnn: torch.Tensor  # [1, d, 2 + 2 stride]
    conformer_att: torch.Tensor  # [blocks + up_blocks, 1, heads, T50, 2 d_k]
    estimator_cnn: torch.Tensor  # [steps, depth, 2, 2 hidden, 2]
    estimator_att: torch.Tensor  # [steps, depth, 2, heads, T50, 2 head_dim]

    def clone(self) -> FlowCache:
        return FlowCache(
            *(t.clone() for t in (self.conformer_cnn, self.conformer_att, self.estimator_cnn, self.estimator_att))
        )

    @staticmethod
    def batch(caches: list[FlowCache]) -> FlowCache:
        """Several sessions' caches (of equal lengths) as one batch's; the estimator's cond rows of every
        session come first, then their uncond rows, as ``ChunkCFM.forward_chunk`` lays out its batch."""
        if len(caches) == 1:
            return caches[0]
        return FlowCache(
            torch.cat([c.conformer_cnn for c in caches], dim=0),
            torch.cat([c.conformer_att for c in caches], dim=1),
            torch.stack([c.estimator_cnn for c in caches], dim=3).flatten(2, 3),
            torch.stack([c.estimator_att for c in caches], dim=3).flatten(2, 3),
        )

    def unbatch(self, n: int) -> list[FlowCache]:
        """The ``n`` sessions' caches of a batch's (``batch`` undone), each a copy of its own rows."""
        if n == 1:
            return [self]
        cnn = self.estimator_cnn.unflatten(2, (2, n))
        att = self.estimator_att.unflatten(2, (2, n))
        # Copies, not views: a view would keep the whole batch's caches alive as long as any session lives.
        return [
            FlowCache(
                self.conformer_cnn[i : i + 1].clone(),
                self.conformer_att[:, i : i + 1].clone(),
                cnn[:, :, :, i].clone(),
                att[:, :, :, i].clone(),
            )
            for i in range(n)
        ]

    def shapes(self) -> tuple[torch.Size, ...]:
        """The tensors' shapes: sessions whose shapes are equal can run as one batch."""
        return tuple(t.shape for t in (self.conformer_cnn, self.conformer_att, self.estimator_cnn, self.estimator_att))

    def trim(self, prompt_frames: int) -> None:
        """Keep the first ``prompt_frames`` and the last 100 cached frames once the caches grow past both."""
        if self.estimator_att.shape[4] > prompt_frames + KEEP_RECENT:
            a = self.estimator_att
            self.estimator_att = torch.cat([a[:, :, :, :, :prompt_frames], a[:, :, :, :, -KEEP_RECENT:]], dim=4)
        if self.conformer_att.shape[3] > prompt_frames + KEEP_RECENT:
            a = self.conformer_att
            self.conformer_att = torch.cat([a[:, :, :, :prompt_frames], a[:, :, :, -KEEP_RECENT:]], dim=3)

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.conformer_cnn, self.conformer_att, self.estimator_cnn, self.estimator_att)
        )

    def nbytes_at(self, frames: int) -> int:
        """The caches' bytes once both attention caches hold ``frames`` frames (the conv caches do not grow)."""
        fixed = sum(t.numel() * t.element_size() for t in (self.conformer_cnn, self.estimator_cnn))
        grown = 0
        for att, time_dim in ((self.conformer_att, 3), (self.estimator_att, 4)):
            grown += att.numel() // max(1, att.shape[time_dim]) * frames * att.element_size()
        return fixed + grown


class CausalFlow(nn.Module):
    """``flow``: parameter names follow the published ``flow.pt``."""

    def __init__(self, cfg: FlowConfig, noise_seed: int = NOISE_SEED):
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = TokenEncoder(cfg.encoder)
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = ChunkCFM(cfg.estimator, cfg.inference_cfg_rate, noise_seed)
        self.pre_lookahead_len = cfg.encoder.pre_lookahead_len
        self.up_rate = cfg.encoder.up_stride

    def _speaker(self, spk: torch.Tensor) -> torch.Tensor:
        return self.spk_embed_affine_layer(F.normalize(spk, dim=1))

    @torch.inference_mode()
    def setup(self, tokens: torch.Tensor, mel: torch.Tensor, spk: torch.Tensor, n_timesteps: int) -> FlowCache:
        """Prime the caches with the prompt: tokens [1, T + lookahead], mel [1, 2T, 80], spk [1, 192]."""
        if (tokens.shape[1] - self.pre_lookahead_len) * self.up_rate != mel.shape[1]:
            raise ValueError(f"prompt tokens {tuple(tokens.shape)} and mel {tuple(mel.shape)} do not line up")
        h, cnn, att = self.encoder.forward_chunk(
            self.input_embedding(tokens), last_chunk=False, cnn_cache=None, att_cache=None
        )
        h = self.encoder_proj(h)
        _, e_cnn, e_att = self.decoder.forward_chunk(
            h.transpose(1, 2).contiguous(),
            self._speaker(spk),
            mel.transpose(1, 2).contiguous(),
            n_timesteps,
            None,
            None,
        )
        return FlowCache(cnn, att, e_cnn, e_att)

    @torch.inference_mode()
    def chunk(
        self, tokens: torch.Tensor, spk: torch.Tensor, cache: FlowCache, *, last_chunk: bool, n_timesteps: int
    ) -> tuple[torch.Tensor, FlowCache]:
        """Mel [b, 80, frames] for one chunk of tokens [b, t] of b sessions (``FlowCache.batch``), and the caches
        after it; spk [b, 192]."""
        h, cnn, att = self.encoder.forward_chunk(
            self.input_embedding(tokens),
            last_chunk=last_chunk,
            cnn_cache=cache.conformer_cnn,
            att_cache=cache.conformer_att,
        )
        h = self.encoder_proj(h).transpose(1, 2).contiguous()
        mel, e_cnn, e_att = self.decoder.forward_chunk(
            h, self._speaker(spk), torch.zeros_like(h), n_timesteps, cache.estimator_cnn, cache.estimator_att
        )
        return mel, FlowCache(cnn, att, e_cnn, e_att)
