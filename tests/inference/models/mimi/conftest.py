"""Fixtures for the Mimi codec tests: the golden tiny Mimi, a second random tiny Mimi, test audio, reference runs.

Data: `tests/data/personaplex/` is the PersonaPlex golden pack: its `ckpt/` holds the tiny Mimi (`mimi.safetensors`, `mimi_config.json`),
its `voice_prompt.wav` and the reference's codes for it. Everything else is generated in the test session.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import save_file

from inference.audio.loudness import normalize_loudness
from inference.models.moshi.mimi import MimiCodec
from inference.models.moshi.mimi_config import MimiConfig
from inference.models.moshi.mimi_loading import load_mimi, random_mimi_state_dict

REPO = Path(__file__).resolve().parents[4]
DATA = REPO / "tests" / "data" / "personaplex"
REF_PYTHON = REPO / ".venv-moshi-ref" / "bin" / "python"
REF_RUNNER = Path(__file__).with_name("mimi_ref_runner.py")
FRAME = 1920
NUM_FRAMES = 28  # the voice prompt's length in frames; >= 20 as the streaming-decode check asks
RANDOM_SEED = 20261129


@pytest.fixture(autouse=True)
def _single_thread(single_torch_thread):
    """Every test here runs torch on one thread (``single_torch_thread``, tests/conftest.py)."""


@pytest.fixture(scope="session")
def tiny_config() -> MimiConfig:
    return MimiConfig.from_dict(json.loads((DATA / "ckpt" / "mimi_config.json").read_text()))


@pytest.fixture(scope="session")
def golden_codec(tiny_config) -> MimiCodec:
    return load_mimi(DATA / "ckpt" / "mimi.safetensors", tiny_config, num_codebooks=8)


@pytest.fixture(scope="session")
def random_mimi_file(tmp_path_factory, tiny_config) -> Path:
    path = tmp_path_factory.mktemp("random_mimi") / "mimi.safetensors"
    save_file(random_mimi_state_dict(tiny_config, RANDOM_SEED), str(path))
    return path


@pytest.fixture(scope="session")
def random_codec(random_mimi_file, tiny_config) -> MimiCodec:
    return load_mimi(random_mimi_file, tiny_config, num_codebooks=8)


def read_voice_prompt() -> np.ndarray:
    """The golden voice prompt as the reference prepares it: float32, -24 LUFS, mono [T]."""
    pcm, rate = sf.read(DATA / "voice_prompt.wav", dtype="float32")
    assert rate == 24000 and pcm.ndim == 1
    return normalize_loudness(pcm, rate, -24.0)


def chirp_with_noise(num_samples: int, seed: int = 7) -> np.ndarray:
    """A 100 Hz -> 6 kHz log chirp under a slow tremolo, plus white noise: broadband, non-stationary."""
    t = np.arange(num_samples) / 24000.0
    duration = num_samples / 24000.0
    f0, f1 = 100.0, 6000.0
    phase = 2 * np.pi * f0 * duration / np.log(f1 / f0) * (np.power(f1 / f0, t / duration) - 1)
    tremolo = 0.6 + 0.4 * np.sin(2 * np.pi * 1.7 * t)
    noise = np.random.default_rng(seed).standard_normal(num_samples) * 0.05
    return (0.4 * tremolo * np.sin(phase) + noise).astype(np.float32)


@pytest.fixture(scope="session")
def test_audio() -> torch.Tensor:
    """[2, 1, 28 * 1920] float32: row 0 the normalised voice prompt (zero-padded), row 1 chirp + noise."""
    total = NUM_FRAMES * FRAME
    voice = read_voice_prompt()
    voice = np.pad(voice, (0, total - voice.shape[0]))
    rows = np.stack([voice, chirp_with_noise(total)])[:, None, :]
    return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))


@pytest.fixture(scope="session")
def random_codes() -> torch.Tensor:
    """[2, 8, 24] int64 codes, uniform over the 2048 bins."""
    generator = torch.Generator().manual_seed(5)
    return torch.randint(0, 2048, (2, 8, 24), generator=generator)


def run_reference(weights: Path, config: MimiConfig, pcm: torch.Tensor, codes: torch.Tensor, workdir: Path) -> dict:
    """Run moshi 0.2.13's Mimi on the inputs (see mimi_ref_runner.py); skips when the reference venv is absent."""
    if not REF_PYTHON.exists():
        pytest.skip(f"reference venv {REF_PYTHON.parent.parent} is missing")
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "mimi_config.json"
    config_path.write_text(json.dumps(config.to_dict()))
    inputs, out = workdir / "inputs.npz", workdir / "out.npz"
    np.savez(inputs, pcm=pcm.numpy(), codes=codes.numpy())
    env = {**os.environ, "NO_TORCH_COMPILE": "1", "NO_CUDA_GRAPH": "1", "OMP_NUM_THREADS": "1"}
    cmd = [str(REF_PYTHON), str(REF_RUNNER), "--weights", str(weights), "--config", str(config_path),
           "--inputs", str(inputs), "--out", str(out)]  # fmt: skip
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=workdir)
    assert result.returncode == 0, f"reference runner failed:\n{result.stderr[-4000:]}"
    with np.load(out) as data:
        return {k: torch.from_numpy(data[k]) for k in data.files}


@pytest.fixture(scope="session")
def golden_reference(tmp_path_factory, tiny_config, test_audio, random_codes) -> dict:
    workdir = tmp_path_factory.mktemp("ref_golden")
    return run_reference(DATA / "ckpt" / "mimi.safetensors", tiny_config, test_audio, random_codes, workdir)


@pytest.fixture(scope="session")
def random_reference(tmp_path_factory, random_mimi_file, tiny_config, test_audio, random_codes) -> dict:
    workdir = tmp_path_factory.mktemp("ref_random")
    return run_reference(random_mimi_file, tiny_config, test_audio, random_codes, workdir)


# --- Kyutai -> transformers (`kyutai/mimi` hub) names, for the layout tests ---------------------------------


def interleaved_to_half_split(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Kyutai rotates pairs (2i, 2i+1); transformers rotates (i, i + d/2): reorder each head's rows."""
    out_dim, in_dim = weight.shape
    head_dim = out_dim // heads
    return weight.view(heads, head_dim // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


LAYER_NAMES = {
    "self_attn.out_proj.weight": "self_attn.o_proj.weight",
    "linear1.weight": "mlp.fc1.weight",
    "linear2.weight": "mlp.fc2.weight",
    "norm1.weight": "input_layernorm.weight",
    "norm1.bias": "input_layernorm.bias",
    "norm2.weight": "post_attention_layernorm.weight",
    "norm2.bias": "post_attention_layernorm.bias",
    "layer_scale_1.scale": "self_attn_layer_scale.scale",
    "layer_scale_2.scale": "mlp_layer_scale.scale",
}


def _kyutai_to_hf(state: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    """Kyutai names -> the flat names of the `kyutai/mimi` hub checkpoint."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if m := re.fullmatch(
            r"(encoder|decoder)\.model\.(\d+)\.(block\.\d+\.)?(conv\.conv|convtr\.convtr)\.(\w+)", key
        ):
            side, index, block, _, param = m.groups()
            out[f"{side}.layers.{index}.{block or ''}conv.{param}"] = value
        elif m := re.fullmatch(r"(encoder|decoder)_transformer\.transformer\.layers\.(\d+)\.(.+)", key):
            side, index, rest = m.groups()
            prefix = f"{side}_transformer.layers.{index}."
            if rest == "self_attn.in_proj_weight":
                q, k, v = value.chunk(3, dim=0)
                out[prefix + "self_attn.q_proj.weight"] = interleaved_to_half_split(q, heads)
                out[prefix + "self_attn.k_proj.weight"] = interleaved_to_half_split(k, heads)
                out[prefix + "self_attn.v_proj.weight"] = v
            else:
                out[prefix + LAYER_NAMES[rest]] = value
        elif key == "downsample.conv.conv.conv.weight":
            out["downsample.conv.weight"] = value
        elif key == "upsample.convtr.convtr.convtr.weight":
            out["upsample.conv.weight"] = value
        elif m := re.fullmatch(r"quantizer\.(rvq_first|rvq_rest)\.(.+)", key):
            part, rest = m.groups()
            name = "semantic" if part == "rvq_first" else "acoustic"
            rest = re.sub(r"^vq\.layers\.(\d+)\._codebook\.", r"layers.\1.codebook.", rest)
            rest = rest.replace("embedding_sum", "embed_sum").replace("._initialized", ".initialized")
            out[f"quantizer.{name}_residual_vector_quantizer.{rest}"] = value
        else:
            raise AssertionError(f"no transformers name for {key}")
    return {k: v.contiguous() for k, v in out.items()}


@pytest.fixture(scope="session")
def kyutai_to_hf():
    """The test-side Kyutai -> `kyutai/mimi` converter: (state_dict, num_heads) -> state_dict."""
    return _kyutai_to_hf


@pytest.fixture(scope="session")
def reference():
    """`run_reference(weights, config, pcm, codes, workdir)`: moshi 0.2.13's outputs (skips without the venv)."""
    return run_reference


@pytest.fixture(scope="session")
def chirp():
    """`chirp_with_noise(num_samples, seed)`: deterministic broadband test audio."""
    return chirp_with_noise
