"""Load a MiniCPM-o 4.5 checkpoint directory in the published layout.

The directory holds ``config.json``, the tokenizer files (``vocab.json``, ``merges.txt``,
``tokenizer_config.json`` ...) and the weights as ``model.safetensors`` or as shards listed by
``model.safetensors.index.json``. Key and shape checks are strict: a missing, unexpected or misshapen
tensor raises ``CheckpointError`` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from inference.models.minicpmo.audio_encoder import StreamingAudioInput
from inference.models.minicpmo.config import CheckpointError, MiniCPMOConfig
from inference.models.minicpmo.llm import DuplexLLM
from inference.models.minicpmo.tts import MiniCPMTTS
from inference.models.minicpmo.vision import VisionInput
from inference.models.safetensors_files import read_safetensors_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def weight_files(checkpoint_dir: Path) -> dict[str, Path]:
    """Map every tensor name to the file that holds it (single file or sharded index)."""
    index = checkpoint_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({exc})") from exc
        files = {name: checkpoint_dir / fname for name, fname in weight_map.items()}
        for name, path in files.items():
            if not path.is_file():
                raise CheckpointError(f"{index}: shard {path.name} for tensor {name!r} is missing")
        return files
    single = checkpoint_dir / SINGLE_FILE
    if not single.is_file():
        raise CheckpointError(f"{checkpoint_dir}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
    try:
        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{single}: unreadable safetensors file ({exc})") from exc


def read_tensors(files: dict[str, Path]) -> dict[str, torch.Tensor]:
    """Read the tensors of ``files`` (one open per shard)."""
    by_file: dict[Path, list[str]] = {}
    for name, path in files.items():
        by_file.setdefault(path, []).append(name)
    out: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        out.update(read_safetensors_file(path, CheckpointError, names=names))
    return out


@dataclass
class MiniCPMOParts:
    """The loaded model: independent parts sharing nothing but the device, plus tokenizer and config."""

    config: MiniCPMOConfig
    llm: DuplexLLM
    audio: StreamingAudioInput
    vision: VisionInput
    tts: MiniCPMTTS
    tokenizer: object
    bad_token_ids: list[int] = field(default_factory=list)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32

    def modules(self) -> dict[str, tuple[str, nn.Module]]:
        """Checkpoint prefix to strip, per part."""
        return {
            "llm": ("", self.llm),
            "audio": ("", self.audio),
            "vision": ("", self.vision),
            "tts": ("tts.", self.tts),
        }

    def parameter_bytes(self) -> int:
        """Bytes of all parameters."""
        return sum(p.numel() * p.element_size() for _, m in self.modules().values() for p in m.parameters())


def expected_shapes(parts: MiniCPMOParts) -> dict[str, tuple[int, ...]]:
    """Every checkpoint key the architecture needs, with its shape."""
    shapes: dict[str, tuple[int, ...]] = {}
    for prefix, module in parts.modules().values():
        for name, tensor in module.state_dict().items():
            shapes[prefix + name] = tuple(tensor.shape)
    return shapes


def check_keys(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> None:
    """Raise ``CheckpointError`` naming the first missing, unexpected or misshapen tensor."""
    missing = sorted(set(expected) - set(found))
    if missing:
        raise CheckpointError(f"checkpoint is missing tensor {missing[0]!r} ({len(missing)} missing in all)")
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise CheckpointError(f"checkpoint has unexpected tensor {unexpected[0]!r} ({len(unexpected)} in all)")
    for name, shape in expected.items():
        if tuple(found[name]) != shape:
            raise CheckpointError(f"tensor {name!r} has shape {tuple(found[name])}, expected {shape}")


def load_tokenizer(checkpoint_dir: Path) -> tuple[object, list[int]]:
    """The Qwen2 BPE tokenizer with MiniCPM-o's added tokens, and the decoder's ``bad_token_ids``."""
    from transformers import Qwen2Tokenizer

    for needed in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        if not (checkpoint_dir / needed).is_file():
            raise CheckpointError(f"{checkpoint_dir}: tokenizer file {needed} is missing")
    tokenizer = Qwen2Tokenizer.from_pretrained(str(checkpoint_dir))
    tok_cfg = json.loads((checkpoint_dir / "tokenizer_config.json").read_text())
    bad = [int(i) for i in tok_cfg.get("bad_token_ids", [])]
    return tokenizer, bad


def build_parts(cfg: MiniCPMOConfig, tokenizer: object = None, bad_token_ids: list[int] | None = None) -> MiniCPMOParts:
    """The architecture ``cfg`` describes, with initial (not loaded) weights."""
    return MiniCPMOParts(
        config=cfg,
        llm=DuplexLLM(cfg),
        audio=StreamingAudioInput(cfg.audio, cfg.hidden_size, cfg.audio_pool_step),
        vision=VisionInput(cfg),
        tts=MiniCPMTTS(cfg.tts),
        tokenizer=tokenizer,
        bad_token_ids=list(bad_token_ids or []),
    )


def load_model(
    checkpoint_dir: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> MiniCPMOParts:
    """Build the architecture from ``config.json`` and load the weights with strict checks.

    Args:
        checkpoint_dir: directory in the published layout.
        device: where the parameters go.
        dtype: parameter dtype (float32 reproduces the goldens; bfloat16 for GPUs).

    Returns:
        The loaded parts, in eval mode.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise CheckpointError(f"{checkpoint_dir}: not a directory")
    cfg = MiniCPMOConfig.from_dir(checkpoint_dir)
    tokenizer, bad = load_tokenizer(checkpoint_dir)
    parts = build_parts(cfg, tokenizer, bad)
    parts.device, parts.dtype = torch.device(device), dtype
    files = weight_files(checkpoint_dir)
    tensors = read_tensors(files)
    check_keys(expected_shapes(parts), {k: tuple(v.shape) for k, v in tensors.items()})
    for prefix, module in parts.modules().values():
        own = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)} if prefix else tensors
        wanted = module.state_dict().keys()
        module.load_state_dict({k: own[k] for k in wanted}, strict=True)
        module.to(device=device, dtype=dtype).eval()
    parts.tts.bake()
    del tensors
    if parts.device.type == "cuda":  # the eager path on the fast path's reductions (invariant/modules.py)
        from inference.models.minicpmo.invariant.modules import use_row_invariant_kernels

        use_row_invariant_kernels(parts)
    return parts
