"""The loaded model's eager modules on the row-invariant kernels: what the eager path runs on CUDA.

``use_row_invariant_kernels`` points the LLM's, the TTS's and the audio encoder's linears, norms and
attention at ``kernels``, instance by instance (the vision tower keeps torch's: both paths run it alike).
The modules stay ``transformers``' and this project's own: the eager path still decides through
``Qwen3ForCausalLM`` over a ``DynamicCache``, one session at a time; only the reductions are the ones the
fast path's batched, graphed steps use, so the two reach the same bits (``fast.decoder`` rounds where the
modules round). Float32 stays exact float32, so the float32 goldens hold on CUDA too.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from inference.models.minicpmo.audio_encoder import WhisperAttention
from inference.models.minicpmo.invariant import kernels

ATTENTION = "parley_row_invariant"  # the transformers attention implementation registered here


def _linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return kernels.linear(x, module.weight, module.bias)


def _rms_norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return kernels.rms_norm(x, module.weight, module.variance_epsilon)


def _layer_norm(module: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return kernels.layer_norm(x, module.weight, module.bias, module.eps)


def _over_cache(q, k, v, scale: float, *, causal: bool) -> torch.Tensor:
    """Attention over per-sequence caches [B, H_kv, L, hd] whose last T keys are the queries' own: each batch
    entry is a slot of its own, starting at L - T."""
    B, _, T, _ = q.shape
    L = k.shape[2]
    slots = torch.arange(B, device=q.device)
    starts = torch.full((B,), L - T, dtype=torch.long, device=q.device)
    return kernels.attention(q, k, v, slots, starts, L, scale, causal=causal)


def _causal_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """``transformers``' attention interface (the mask is not needed: a cache's queries are its last keys)."""
    return _over_cache(query, key, value, scaling, causal=True), None


def _whisper_attend(module: WhisperAttention, q, k, v, mask):
    if mask is not None:  # the reference audio's masked pass: shared by both paths as it is
        return WhisperAttention.attend(module, q, k, v, mask)
    return _over_cache(q, k, v, q.shape[-1] ** -0.5, causal=False)


def use_row_invariant_kernels(parts) -> None:
    """Swap ``parts``' LLM, TTS and audio encoder onto the kernels (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _causal_attention)
    for root in (parts.llm, parts.tts, parts.audio):
        for module in root.modules():
            if isinstance(module, nn.Linear):
                module.forward = partial(_linear, module)
            elif isinstance(module, nn.LayerNorm):
                module.forward = partial(_layer_norm, module)
            elif type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
                module.forward = partial(_rms_norm, module)
            elif isinstance(module, WhisperAttention):
                module.attend = partial(_whisper_attend, module)
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation"):
                config._attn_implementation = ATTENTION
