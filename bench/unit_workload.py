"""The unit benches' shared workload: the real 4.5 shapes, the caller audio and the speaking rule.

Numpy and torch only, so that bench/unit_reference.py, which runs beside the reference's own transformers, imports
the same workload as bench/unit_gpu.py without importing Parley's engine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "minicpmo45"
# the published MiniCPM-o 4.5 shapes over the golden pack's config (Qwen3-8B LLM, Whisper-medium, SigLIP, 0.35 B TTS)
REAL_45 = {
    "vocab_size": 151748, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "query_num": 64, "image_size": 448, "audio_pool_step": 5,
    "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14, "image_size": 980},
    "audio_config": {"d_model": 1024, "encoder_layers": 24, "encoder_attention_heads": 16, "encoder_ffn_dim": 4096,
                     "num_mel_bins": 80, "max_source_positions": 1500},
    "tts_config": {"llm_dim": 4096, "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
                   "num_key_value_heads": 12, "num_hidden_layers": 20, "max_position_embeddings": 4096,
                   "num_audio_tokens": 6562, "num_text_tokens": 152064, "audio_bos_token_id": 151687},
}  # fmt: skip


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_audio(seconds: int, seed: int) -> np.ndarray:
    """The golden pack's user speech, tiled to ``seconds`` at 16 kHz, with a little noise."""
    speech = np.load(DATA / "turnclose10" / "user_audio.npy").astype(np.float32)
    rng = np.random.default_rng(seed)
    reps = -(-seconds * 16000 // speech.shape[0])
    return np.tile(speech, reps)[: seconds * 16000] + rng.normal(0, 1e-3, seconds * 16000).astype(np.float32)


def speaks(session_index: int, unit: int) -> bool:
    """40% of units speak, staggered across sessions so every tick has about 40% speaking."""
    return unit >= 3 and (unit + session_index) % 5 in (1, 3)
