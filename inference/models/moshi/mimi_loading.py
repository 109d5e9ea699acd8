"""Reading Mimi checkpoints into `MimiCodec`'s (Kyutai) key layout, with strict key and shape checks.

Three layouts are recognised from the keys alone:

- `kyutai`: the published `tokenizer-e351c8d8-checkpoint125.safetensors` names (`encoder.model.0.conv.conv.weight`,
  fused `self_attn.in_proj_weight`, `quantizer.rvq_first...`). Loaded as is.
- `hf`: the `kyutai/mimi` repository on the Hugging Face hub (`encoder.layers.0.conv.weight`, split
  `q_proj`/`k_proj`/`v_proj`, `quantizer.semantic_residual_vector_quantizer...`).
- `hf_nested`: what transformers 5.x `MimiModel.save_pretrained` writes (`encoder.encoder_seanet.layers...`,
  `encoder.encoder_transformer...`, `decoder.upsample...`).

transformers applies RoPE to half-split (rotate-half) head dims while Mimi rotates interleaved pairs, so its q/k
rows are a per-head permutation of Kyutai's; `hf` q/k rows are permuted back before fusing q|k|v.

`load_mimi` builds a ready `MimiCodec` from such a file; `random_mimi_state_dict` writes the other way round: a
complete random checkpoint for tests and demos.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from inference.models.moshi.loading import key_set_mismatch
from inference.models.moshi.mimi import MimiCodec
from inference.models.moshi.mimi_config import MimiConfig
from inference.models.moshi.seeded import unit_noise
from inference.models.safetensors_files import read_safetensors_file

__all__ = [
    "MimiLoadError",
    "detect_layout",
    "hf_to_kyutai",
    "load_mimi",
    "load_mimi_state_dict",
    "random_mimi_state_dict",
    "read_safetensors",
]


class MimiLoadError(ValueError):
    """A Mimi checkpoint cannot be used: unreadable file, unknown layout, or a missing/extra/misshapen key."""


_NESTED_TO_FLAT = [
    (r"^encoder\.encoder_seanet\.layers\.", "encoder.layers."),
    (r"^encoder\.encoder_transformer\.", "encoder_transformer."),
    (r"^encoder\.downsample\.", "downsample."),
    (r"^decoder\.upsample\.", "upsample."),
    (r"^decoder\.decoder_transformer\.", "decoder_transformer."),
    (r"^decoder\.decoder_seanet\.layers\.", "decoder.layers."),
]

_HF_LAYER_RENAMES = {
    "self_attn.o_proj.weight": "self_attn.out_proj.weight",
    "mlp.fc1.weight": "linear1.weight",
    "mlp.fc2.weight": "linear2.weight",
    "input_layernorm.weight": "norm1.weight",
    "input_layernorm.bias": "norm1.bias",
    "post_attention_layernorm.weight": "norm2.weight",
    "post_attention_layernorm.bias": "norm2.bias",
    "self_attn_layer_scale.scale": "layer_scale_1.scale",
    "mlp_layer_scale.scale": "layer_scale_2.scale",
}

_HF_CODEBOOK_RENAMES = {"embed_sum": "embedding_sum", "cluster_usage": "cluster_usage", "initialized": "_initialized"}


def read_safetensors(path: Any) -> dict[str, torch.Tensor]:
    """Read every tensor of a safetensors file on CPU; raises `MimiLoadError` naming the file."""
    return read_safetensors_file(path, MimiLoadError)


def detect_layout(keys: Any) -> str:
    """Name the key layout of a Mimi state dict: 'kyutai', 'hf' or 'hf_nested'."""
    keys = list(keys)
    if any(k.startswith(("encoder.model.", "quantizer.rvq_first.")) for k in keys):
        return "kyutai"
    if any(k.startswith(("encoder.encoder_seanet.", "decoder.decoder_seanet.")) for k in keys):
        return "hf_nested"
    if any(k.startswith(("encoder.layers.", "quantizer.semantic_residual_vector_quantizer.")) for k in keys):
        return "hf"
    sample = sorted(keys)[:3]
    raise MimiLoadError(f"unrecognised Mimi checkpoint layout (neither Kyutai nor transformers); first keys {sample}")


def _unpermute_rope_rows(weight: torch.Tensor, num_heads: int, key: str) -> torch.Tensor:
    """transformers' half-split head rows (all real parts, then all imaginary) -> Kyutai's interleaved pairs."""
    out_dim, in_dim = weight.shape
    if out_dim % (2 * num_heads):
        raise MimiLoadError(f"{key}: {out_dim} rows do not split into {num_heads} heads of even size")
    half = out_dim // num_heads // 2
    return weight.reshape(num_heads, 2, half, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def hf_to_kyutai(state: dict[str, torch.Tensor], config: MimiConfig) -> dict[str, torch.Tensor]:
    """Translate a transformers (`hf` or `hf_nested`) Mimi state dict to Kyutai names.

    SEANet indices are kept; which decoder indices are transposed convs is read off the codec's own module tree.
    Keys that match no rule are kept under their original name so the strict check reports them.
    """
    flat: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for pattern, replacement in _NESTED_TO_FLAT:
            key = re.sub(pattern, replacement, key)
        flat[key] = value

    with torch.device("meta"):
        skeleton = MimiCodec(config, num_codebooks=config.quantizer.n_q)
    expected = set(skeleton.state_dict())
    heads = config.transformer.num_heads
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        m = re.match(r"^(encoder|decoder)\.layers\.(\d+)\.(block\.\d+\.)?conv\.(weight|bias)$", key)
        if m:
            side, index, block, param = m.groups()
            block = block or ""
            conv = f"{side}.model.{index}.{block}conv.conv.{param}"
            convtr = f"{side}.model.{index}.{block}convtr.convtr.{param}"
            out[convtr if convtr in expected else conv] = value
            continue
        m = re.match(r"^(encoder|decoder)_transformer\.layers\.(\d+)\.(.+)$", key)
        if m:
            side, index, rest = m.groups()
            prefix = f"{side}_transformer.transformer.layers.{index}."
            proj = re.match(r"^self_attn\.([qkv])_proj\.weight$", rest)
            if proj:
                which = proj.group(1)
                if which in "qk":
                    value = _unpermute_rope_rows(value, heads, key)
                qkv.setdefault(prefix, {})[which] = value
                continue
            out[prefix + _HF_LAYER_RENAMES.get(rest, rest)] = value
            continue
        m = re.match(r"^quantizer\.(semantic|acoustic)_residual_vector_quantizer\.(.+)$", key)
        if m:
            kind, rest = m.groups()
            part = "rvq_first" if kind == "semantic" else "rvq_rest"
            book = re.match(r"^layers\.(\d+)\.codebook\.(\w+)$", rest)
            if book:
                name = _HF_CODEBOOK_RENAMES.get(book.group(2), book.group(2))
                out[f"quantizer.{part}.vq.layers.{book.group(1)}._codebook.{name}"] = value
            else:
                out[f"quantizer.{part}.{rest}"] = value
            continue
        if key == "downsample.conv.weight":
            out["downsample.conv.conv.conv.weight"] = value
            continue
        if key == "upsample.conv.weight":
            out["upsample.convtr.convtr.convtr.weight"] = value
            continue
        out[key] = value  # unknown: reported by the strict check under its own name

    for prefix, parts in qkv.items():
        missing = [p for p in "qkv" if p not in parts]
        if missing:
            raise MimiLoadError(f"missing key {prefix}self_attn.{missing[0]}_proj.weight (transformers layout)")
        out[prefix + "self_attn.in_proj_weight"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def check_state_dict(state: dict[str, torch.Tensor], config: MimiConfig, source: str) -> None:
    """Strict check against the codec built from `config`: every key present, none extra, shapes equal."""
    with torch.device("meta"):
        skeleton = MimiCodec(config, num_codebooks=config.quantizer.n_q)
    expected = skeleton.state_dict()
    mismatch = key_set_mismatch(expected, state)
    if mismatch:
        raise MimiLoadError(f"{source}: {mismatch}")
    for key, ref in expected.items():
        value = state[key]
        if tuple(value.shape) != tuple(ref.shape):
            raise MimiLoadError(
                f"{source}: key {key!r} has shape {list(value.shape)}, the config expects {list(ref.shape)}"
            )
        if not (value.is_floating_point() or value.dtype == torch.bool):
            raise MimiLoadError(f"{source}: key {key!r} has dtype {value.dtype}, expected a floating-point tensor")


def load_mimi_state_dict(path: Any, config: MimiConfig) -> dict[str, torch.Tensor]:
    """Read a Mimi safetensors file in any supported layout and return it checked, in Kyutai names, float32."""
    raw = read_safetensors(path)
    source = f"Mimi checkpoint {str(path)!r}"
    try:
        layout = detect_layout(raw.keys())
    except MimiLoadError as exc:
        raise MimiLoadError(f"{source}: {exc}") from exc
    state = raw if layout == "kyutai" else hf_to_kyutai(raw, config)
    check_state_dict(state, config, f"{source} ({layout} layout)")
    return {k: v.to(torch.float32) for k, v in state.items()}


def _codebook_buffers(config: MimiConfig, generator: torch.Generator) -> dict[str, torch.Tensor]:
    q = config.quantizer
    out: dict[str, torch.Tensor] = {}
    for part, n in (("rvq_first", q.n_q_semantic), ("rvq_rest", q.n_q - q.n_q_semantic)):
        prefix = f"quantizer.{part}"
        out[f"{prefix}.input_proj.weight"] = unit_noise((q.dimension, q.input_dimension, 1), generator)
        out[f"{prefix}.input_proj.weight"] /= math.sqrt(q.input_dimension)
        out[f"{prefix}.output_proj.weight"] = unit_noise((q.output_dimension, q.dimension, 1), generator)
        out[f"{prefix}.output_proj.weight"] /= math.sqrt(q.dimension)
        for i in range(n):
            book = f"{prefix}.vq.layers.{i}._codebook"
            # Usage varies per centroid so the division embedding_sum / cluster_usage is exercised for real.
            usage = 0.5 + torch.rand(q.bins, generator=generator) * 4.0
            # Later residual stages quantise smaller residuals: shrink their centroids geometrically.
            centroids = unit_noise((q.bins, q.dimension), generator) * (0.5**i)
            out[f"{book}.cluster_usage"] = usage
            out[f"{book}.embedding_sum"] = centroids * usage[:, None]
            out[f"{book}._initialized"] = torch.ones(1)
    return out


def random_mimi_state_dict(config: MimiConfig, seed: int) -> dict[str, torch.Tensor]:
    """A complete random Mimi state dict in Kyutai's key layout, deterministic from `seed`.

    Weights are n / sqrt(fan_in); LayerNorm gains 1 + 0.1 n, biases 0.1 n; layer scales 0.01 (1 + 0.1 n), with n
    unit noise that is the same on every CPU (`seeded.unit_noise`); codebooks have varied usage and initialised
    flags, so the file behaves like a trained one shape-wise. Every tensor is drawn from one explicit
    `torch.Generator`, independent of module construction.
    """
    config.validate()
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        skeleton = MimiCodec(config, num_codebooks=config.quantizer.n_q)
    quantizer = _codebook_buffers(config, generator)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in skeleton.state_dict().items():
        if name.startswith("quantizer."):
            out[name] = quantizer[name]
            continue
        shape = tuple(tensor.shape)
        if name.endswith(("norm1.weight", "norm2.weight")):
            value = 1.0 + 0.1 * unit_noise(shape, generator)
        elif name.endswith(".scale"):
            value = 0.01 * (1.0 + 0.1 * unit_noise(shape, generator))
        elif name.endswith(".bias"):
            value = 0.1 * unit_noise(shape, generator)
        else:
            fan_in = math.prod(shape[1:])
            value = unit_noise(shape, generator) / math.sqrt(fan_in)
        out[name] = value.contiguous()
    missing = set(skeleton.state_dict()) - set(out)
    assert not missing, f"random_mimi_state_dict left out {sorted(missing)}"
    return out


def load_mimi(
    path: Any,
    config: MimiConfig | None = None,
    num_codebooks: int = 8,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> MimiCodec:
    """Load a Mimi safetensors file (Kyutai or transformers layout, detected from the keys).

    Args:
        path: the `.safetensors` file.
        config: codec config; None means the published Kyutai Mimi.
        num_codebooks: active codebooks K.
        device: target device.
        dtype: parameter dtype (codebook buffers follow it).

    Raises:
        MimiLoadError: unreadable file, unknown layout, missing/unexpected key or wrong shape (named).
    """
    config = config if config is not None else MimiConfig.kyutai_default()
    state = load_mimi_state_dict(path, config)
    codec = MimiCodec(config, num_codebooks=num_codebooks)
    codec.load_state_dict(state, strict=True)
    return codec.to(device=device, dtype=dtype).eval()
