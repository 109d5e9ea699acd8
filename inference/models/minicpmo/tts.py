"""MiniCPMTTS head of MiniCPM-o 4.5: text ids + LLM hidden states -> audio codes, one unit at a time.

The backbone is ``transformers``' Llama (``tts.model.*``). A unit's condition is, per text id,
``emb_text[id] + l2normalize(projector_semantic(hidden))``, followed by the audio-bos row; the codes are
then decoded one by one (greedy over the softmax, temperature 0.8, repetition penalty 1.05 over the last 16
codes of this call, eos masked below ``min_new_tokens``). The TTS cache of a turn carries across units and
lives in ``TTSState``, one per session.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm
from transformers import DynamicCache, LlamaConfig, LlamaModel

from inference.models.minicpmo.audio_encoder import ReluProjector
from inference.models.minicpmo.config import TTSConfig

# transformers renamed ``past_key_values`` to ``cache`` (5.2x); older releases (the GPU image has 5.17) take
# an unknown ``cache=`` silently into **kwargs and run without any cache, so pass whichever name this one has.
CACHE_KWARG = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"

TEMPERATURE = 0.8
REPETITION_PENALTY = 1.05
REPETITION_WINDOW = 16
MAX_NEW_CODES = 26  # the 26th code is computed and dropped: 25 codes per second of audio
MIN_NEW_CODES = 26


@dataclass
class TTSState:
    """One session's TTS decoding state: the current turn's cache and its next position."""

    cache: DynamicCache = field(default_factory=DynamicCache)
    pos: int = 0

    def reset(self) -> None:
        """Start a new turn: drop the cache."""
        self.cache = DynamicCache()
        self.pos = 0

    def nbytes(self) -> int:
        """Bytes held by the cache tensors."""
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total


class MiniCPMTTS(nn.Module):
    """Audio-code decoder (``tts.*``)."""

    def __init__(self, cfg: TTSConfig):
        super().__init__()
        self.cfg = cfg
        llama_cfg = LlamaConfig(
            vocab_size=32000,  # tts.model.embed_tokens exists in the checkpoint but is never used
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            num_hidden_layers=cfg.num_hidden_layers,
            max_position_embeddings=cfg.max_position_embeddings,
            rope_theta=cfg.rope_theta,
            rms_norm_eps=cfg.rms_norm_eps,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
        )
        llama_cfg._attn_implementation = "sdpa"
        self.model = LlamaModel(llama_cfg)
        self.emb_text = nn.Embedding(cfg.num_text_tokens, cfg.hidden_size)
        self.emb_code = nn.ModuleList([nn.Embedding(cfg.num_audio_tokens, cfg.hidden_size)])
        self.head_code = nn.ModuleList([weight_norm(nn.Linear(cfg.hidden_size, cfg.num_audio_tokens, bias=False))])
        self.projector_semantic = ReluProjector(cfg.llm_dim, cfg.hidden_size)
        self.projector_spk = ReluProjector(cfg.llm_dim, cfg.hidden_size)  # voice cloning only; unused in duplex
        self.eos = cfg.audio_eos_code

    def bake(self) -> None:
        """After loading: fold the weight norm into a plain weight (it never changes at inference)."""
        for head in self.head_code:
            if parametrize.is_parametrized(head, "weight"):
                parametrize.remove_parametrizations(head, "weight", leave_parametrized=True)

    def condition(self, text_ids: list[int], hidden: torch.Tensor | None) -> torch.Tensor:
        """Condition rows [len(text_ids) + 1, H]: text embedding + normalised semantic projection, then bos."""
        device = self.emb_text.weight.device
        bos = self.emb_text(torch.tensor([self.cfg.audio_bos_token_id], device=device))  # [1, H]
        if not text_ids:
            return bos
        assert hidden is not None and hidden.shape[0] == len(text_ids), "one LLM hidden state per text id"
        text = self.emb_text(torch.tensor(text_ids, device=device))  # [N, H]
        sem = F.normalize(self.projector_semantic(hidden.to(text.dtype)), p=2, dim=-1)  # [N, H]
        return torch.cat([text + sem, bos], dim=0)

    def _step(self, state: TTSState, embeds: torch.Tensor) -> torch.Tensor:
        """Feed [T, H] at ``state.pos``; returns float32 code logits [num_audio_tokens] of the last row."""
        T = embeds.shape[0]
        positions = torch.arange(state.pos, state.pos + T, device=embeds.device)[None]
        out = self.model(
            inputs_embeds=embeds[None], position_ids=positions, use_cache=True, **{CACHE_KWARG: state.cache}
        )
        state.pos += T
        return self.head_code[0](out.last_hidden_state[0, -1]).float()

    @torch.inference_mode()
    def generate_unit(self, state: TTSState, condition: torch.Tensor, min_new_codes: int) -> list[int]:
        """Decode up to ``MAX_NEW_CODES - 1`` codes for one unit, continuing the turn's cache.

        ``state.pos`` ends at the old position + condition rows + returned codes: the last computed code (the
        eos, or the 26th) is never fed.
        """
        temperature = torch.tensor(TEMPERATURE, dtype=torch.float32)
        codes: list[int] = []
        logits = self._step(state, condition)
        t = 0
        for t in range(MAX_NEW_CODES):
            if t > 0:
                logits = self._step(state, self.emb_code[0](torch.tensor([codes[-1]], device=condition.device)))
            logits = logits / temperature
            if t > 0:
                window = torch.tensor(codes[-REPETITION_WINDOW:], dtype=torch.long)
                freq = torch.bincount(window, minlength=logits.shape[0]).to(logits.device)
                alpha = torch.pow(REPETITION_PENALTY, freq)
                logits = torch.where(logits < 0, logits * alpha, logits / alpha)
            if t < min_new_codes:
                logits[self.eos] = -torch.inf
            code = int(torch.argmax(F.softmax(logits, dim=-1)))
            codes.append(code)
            if code == self.eos:
                break
        return codes[:t]
