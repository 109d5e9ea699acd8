"""MiniCPM-o 4.5 configuration: the published ``config.json`` read into typed, frozen dataclasses.

Only the fields the duplex path uses are kept. Unknown fields are ignored (the published file carries many
training-time options); missing required fields raise ``CheckpointError`` naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CheckpointError(Exception):
    """The checkpoint directory is incomplete or does not match the architecture (names the key)."""


def _require(section: dict[str, Any], key: str, where: str) -> Any:
    if key not in section:
        raise CheckpointError(f"config.json: missing field {where}{key!r}")
    return section[key]


@dataclass(frozen=True)
class VisionConfig:
    """SigLIP (NaViT) vision tower."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_hidden_layers: int
    patch_size: int
    image_size: int
    layer_norm_eps: float = 1e-6

    @property
    def patches_per_side(self) -> int:
        """Side of the learned position table (70 for 980 / 14)."""
        return self.image_size // self.patch_size


@dataclass(frozen=True)
class AudioConfig:
    """Whisper-style audio encoder (encoder half only)."""

    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    num_mel_bins: int
    max_source_positions: int


@dataclass(frozen=True)
class TTSConfig:
    """MiniCPMTTS head: a small Llama over text-conditioned audio codes."""

    llm_dim: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    max_position_embeddings: int
    num_audio_tokens: int
    num_text_tokens: int
    audio_bos_token_id: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @property
    def audio_eos_code(self) -> int:
        """The last code is the TTS end of stream."""
        return self.num_audio_tokens - 1


@dataclass(frozen=True)
class MiniCPMOConfig:
    """Top-level config: Qwen3 LLM fields plus the three sub-configs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    query_num: int
    image_size: int
    drop_vision_last_layer: bool
    audio_pool_step: int
    max_slice_nums: int
    vision: VisionConfig
    audio: AudioConfig
    tts: TTSConfig
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MiniCPMOConfig:
        """Build from the parsed ``config.json``; raises ``CheckpointError`` on a missing field."""
        if not isinstance(data, dict):
            raise CheckpointError("config.json: top level must be an object")
        top = {
            k: _require(data, k, "")
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "rope_theta",
                "rms_norm_eps",
            )
        }
        vis = _require(data, "vision_config", "")
        aud = _require(data, "audio_config", "")
        tts = _require(data, "tts_config", "")
        vision = VisionConfig(
            **{
                k: _require(vis, k, "vision_config.")
                for k in (
                    "hidden_size",
                    "intermediate_size",
                    "num_attention_heads",
                    "num_hidden_layers",
                    "patch_size",
                    "image_size",
                )
            },
            layer_norm_eps=float(vis.get("layer_norm_eps", 1e-6)),
        )
        audio = AudioConfig(
            **{
                k: _require(aud, k, "audio_config.")
                for k in (
                    "d_model",
                    "encoder_layers",
                    "encoder_attention_heads",
                    "encoder_ffn_dim",
                    "num_mel_bins",
                    "max_source_positions",
                )
            }
        )
        tts_cfg = TTSConfig(
            **{
                k: _require(tts, k, "tts_config.")
                for k in (
                    "llm_dim",
                    "hidden_size",
                    "intermediate_size",
                    "num_attention_heads",
                    "num_hidden_layers",
                    "num_audio_tokens",
                    "num_text_tokens",
                    "audio_bos_token_id",
                )
            },
            num_key_value_heads=int(tts.get("num_key_value_heads", tts["num_attention_heads"])),
            max_position_embeddings=int(tts.get("max_position_embeddings", 4096)),
            rope_theta=float(tts.get("rope_theta", 10000.0)),
            rms_norm_eps=float(tts.get("rms_norm_eps", 1e-6)),
        )
        slice_cfg = data.get("slice_config", {}) or {}
        return cls(
            **top,
            head_dim=int(data.get("head_dim", top["hidden_size"] // top["num_attention_heads"])),
            max_position_embeddings=int(data.get("max_position_embeddings", 8192)),
            query_num=int(data.get("query_num", 64)),
            image_size=int(data.get("image_size", 448)),
            drop_vision_last_layer=bool(data.get("drop_vision_last_layer", True)),
            audio_pool_step=int(data.get("audio_pool_step", 5)),
            max_slice_nums=int(slice_cfg.get("max_slice_nums", 1)),
            vision=vision,
            audio=audio,
            tts=tts_cfg,
            raw=data,
        )

    @classmethod
    def from_dir(cls, checkpoint_dir: str | Path) -> MiniCPMOConfig:
        """Read ``checkpoint_dir/config.json``."""
        path = Path(checkpoint_dir) / "config.json"
        if not path.is_file():
            raise CheckpointError(f"{path}: config.json not found")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: invalid JSON ({exc})") from exc
        return cls.from_dict(data)

    @property
    def vision_layers_run(self) -> int:
        """The reference drops the last vision layer; its weights are absent from the checkpoint."""
        n = self.vision.num_hidden_layers
        return n - 1 if self.drop_vision_last_layer else n
