"""The MiniCPM-o 4.5 language model: ``transformers``' Qwen3 driven feed by feed over a per-session cache.

Every feed runs the LLM over a run of embeddings at the next cache positions and returns the final-normed
hidden states (what both ``lm_head`` and the TTS read). The cache is a ``DynamicCache`` owned by the
session, so one loaded model serves several sessions.

Long calls: ``drop_span`` removes a span of positions from a cache and rotates the keys after it back by the
span's length, so the remaining context is exactly what it would be had the span never been fed (RoPE is a
rotation: keys at position p rotated by -d sit at p - d).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM, Qwen3Model

from inference.models.minicpmo.config import MiniCPMOConfig

# transformers renamed ``past_key_values`` to ``cache`` (5.2x); older releases (the GPU image has 5.17) take
# an unknown ``cache=`` silently into **kwargs and run without any cache, so pass whichever name this one has.
CACHE_KWARG = "cache" if "cache" in inspect.signature(Qwen3Model.forward).parameters else "past_key_values"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class DuplexLLM(nn.Module):
    """Qwen3 causal LM (``llm.*``) with feed/logits/drop helpers over explicit caches."""

    def __init__(self, cfg: MiniCPMOConfig):
        super().__init__()
        hf_cfg = Qwen3Config(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            max_position_embeddings=cfg.max_position_embeddings,
            rope_theta=cfg.rope_theta,
            rms_norm_eps=cfg.rms_norm_eps,
            tie_word_embeddings=False,
            attention_bias=False,
            hidden_act="silu",
        )
        hf_cfg._attn_implementation = "sdpa"
        self.llm = Qwen3ForCausalLM(hf_cfg)
        self.hidden_size = cfg.hidden_size

    @staticmethod
    def new_cache() -> DynamicCache:
        """An empty per-session KV cache."""
        return DynamicCache()

    @staticmethod
    def cache_length(cache: DynamicCache) -> int:
        """Positions held by ``cache``."""
        return int(cache.get_seq_length())

    def embed_ids(self, ids: list[int]) -> torch.Tensor:
        """Token ids -> [T, D] input embeddings."""
        table = self.llm.model.embed_tokens.weight
        return table[torch.tensor(ids, dtype=torch.long, device=table.device)]

    @torch.inference_mode()
    def feed(self, cache: DynamicCache, embeds: torch.Tensor) -> torch.Tensor:
        """Run embeddings [T, D] at the next positions of ``cache``; returns final-normed hidden [T, D]."""
        start = self.cache_length(cache)
        T = embeds.shape[0]
        positions = torch.arange(start, start + T, device=embeds.device)[None]  # [1, T]
        out = self.llm.model(inputs_embeds=embeds[None], position_ids=positions, use_cache=True, **{CACHE_KWARG: cache})
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[D] final-normed hidden -> float32 [V] logits."""
        return self.llm.lm_head(hidden).float()

    @torch.inference_mode()
    def drop_span(self, cache: DynamicCache, start: int, count: int) -> None:
        """Remove positions [start, start + count) from ``cache``, re-positioning the keys after them."""
        if count <= 0:
            return
        rotary = self.llm.model.rotary_emb
        for layer in cache.layers:
            keys, values = layer.keys, layer.values  # [1, H_kv, T, hd]
            tail_k = keys[:, :, start + count :]
            shift = torch.full((1, 1), count, device=keys.device, dtype=torch.long)
            cos, sin = rotary(tail_k, shift)  # [1, 1, hd] for angle count * theta
            cos, sin = cos[:, None].to(keys.dtype), sin[:, None].to(keys.dtype)
            tail_k = tail_k * cos - _rotate_half(tail_k) * sin  # rotate by -count positions
            layer.keys = torch.cat([keys[:, :, :start], tail_k], dim=2)
            layer.values = torch.cat([values[:, :, :start], values[:, :, start + count :]], dim=2)
