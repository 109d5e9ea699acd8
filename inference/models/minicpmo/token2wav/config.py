"""``flow.yaml`` of the Token2Wav assets, read without executing it.

The published file is a HyperPyYAML document whose ``!new:module.Class`` tags name the classes to build
(``cosyvoice2.flow.flow.CausalMaskedDiffWithXvec`` and its encoder / decoder / estimator). Loading it with
HyperPyYAML would import and call whatever the file names, so here the tags are parsed as plain mappings,
only the four known class names are accepted, and their keyword arguments become frozen dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from inference.models.minicpmo.config import CheckpointError


class AssetError(CheckpointError):
    """A Token2Wav asset is missing, malformed or of the wrong shape; the message names the file."""


FLOW_CLASS = "cosyvoice2.flow.flow.CausalMaskedDiffWithXvec"
ENCODER_CLASS = "cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2"
CFM_CLASS = "cosyvoice2.flow.flow_matching.CausalConditionalCFM"
DIT_CLASS = "cosyvoice2.flow.decoder_dit.DiT"


@dataclass(frozen=True)
class EncoderConfig:
    """Token encoder: conformer blocks at 25 Hz, 2x upsampling, conformer blocks at 50 Hz."""

    input_size: int = 512
    output_size: int = 512
    pre_lookahead_len: int = 3
    num_blocks: int = 6
    num_up_blocks: int = 4
    up_stride: int = 2
    up_scale_factor: float = 2.0
    attention_heads: int = 8
    key_bias: bool = True
    linear_units: int = 2048
    normalize_before: bool = True


@dataclass(frozen=True)
class DiTConfig:
    """Flow-matching estimator (a DiT with a causal conv in each block)."""

    in_channels: int = 320
    out_channels: int = 80
    mlp_ratio: float = 4.0
    depth: int = 16
    num_heads: int = 8
    head_dim: int = 64
    hidden_size: int = 512


@dataclass(frozen=True)
class FlowConfig:
    """The whole flow decoder: token embedding, encoder, speaker projection, CFM over the DiT."""

    input_size: int = 512
    output_size: int = 80
    spk_embed_dim: int = 192
    vocab_size: int = 6561
    inference_cfg_rate: float = 0.7
    encoder: EncoderConfig = EncoderConfig()
    estimator: DiTConfig = DiTConfig()


class _TagLoader(yaml.SafeLoader):
    """Safe YAML loader that turns ``!new:NAME`` / ``!name:NAME`` nodes into ``{"__class__": NAME, ...}``."""


def _construct_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict:
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(None, None, f"!new:{suffix} must be a mapping", node.start_mark)
    value = loader.construct_mapping(node, deep=True)
    return {"__class__": suffix, **value}


_TagLoader.add_multi_constructor("!new:", _construct_tag)
_TagLoader.add_multi_constructor("!name:", _construct_tag)


def _build(cls: type, mapping: dict, path: Path, where: str, ignore: frozenset[str] = frozenset()):
    known = {f.name for f in fields(cls)}
    kwargs = {}
    for key, value in mapping.items():
        if key == "__class__" or key in ignore:
            continue
        if key not in known:
            raise AssetError(f"{path}: {where} has unknown option {key!r}")
        default = getattr(cls(), key)
        if isinstance(default, bool):
            value = bool(value)
        elif isinstance(default, (int, float)) and not isinstance(value, (int, float)):
            raise AssetError(f"{path}: {where}.{key} must be a number, got {value!r}")
        elif isinstance(default, int) and not isinstance(default, bool):
            value = int(value)
        elif isinstance(default, float):
            value = float(value)
        kwargs[key] = value
    return cls(**kwargs)


def _expect(node: object, cls_name: str, path: Path, where: str) -> dict:
    if not isinstance(node, dict) or node.get("__class__") != cls_name:
        got = node.get("__class__") if isinstance(node, dict) else type(node).__name__
        raise AssetError(f"{path}: {where} must be !new:{cls_name}, got {got!r}")
    return node


# Options the reference accepts but that have no effect at inference (dropouts, fixed layer kinds).
_ENCODER_IGNORED = frozenset(
    {
        "input_layer",
        "pos_enc_layer_type",
        "selfattention_layer_type",
        "dropout_rate",
        "positional_dropout_rate",
        "attention_dropout_rate",
        "activation_type",
    }
)


def read_flow_config(path: str | Path) -> FlowConfig:
    """Parse ``flow.yaml``; raise ``AssetError`` naming the file on anything unexpected."""
    path = Path(path)
    try:
        doc = yaml.load(path.read_text(), Loader=_TagLoader)  # noqa: S506 - a SafeLoader subclass
    except FileNotFoundError as exc:
        raise AssetError(f"{path}: missing") from exc
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise AssetError(f"{path}: not a readable flow.yaml ({exc})") from exc
    if not isinstance(doc, dict) or "flow" not in doc:
        raise AssetError(f"{path}: no top-level 'flow' entry")
    flow = _expect(doc["flow"], FLOW_CLASS, path, "flow")
    enc = _expect(flow.get("encoder"), ENCODER_CLASS, path, "flow.encoder")
    cfm = _expect(flow.get("decoder"), CFM_CLASS, path, "flow.decoder")
    dit = _expect(cfm.get("estimator"), DIT_CLASS, path, "flow.decoder.estimator")
    for key, want in (("input_layer", "linear"), ("pos_enc_layer_type", "rel_pos_espnet")):
        if enc.get(key, want) != want:
            raise AssetError(f"{path}: flow.encoder.{key} must be {want!r}, got {enc[key]!r}")
    if enc.get("activation_type", "swish") != "swish":
        raise AssetError(f"{path}: flow.encoder.activation_type must be 'swish'")
    encoder = _build(EncoderConfig, enc, path, "flow.encoder", _ENCODER_IGNORED)
    estimator = _build(DiTConfig, dit, path, "flow.decoder.estimator")
    rate = cfm.get("inference_cfg_rate", 0.7)
    if not isinstance(rate, (int, float)) or rate <= 0:
        raise AssetError(f"{path}: flow.decoder.inference_cfg_rate must be a positive number")
    top = {k: v for k, v in flow.items() if k not in ("encoder", "decoder", "input_embedding")}
    cfg = _build(FlowConfig, top, path, "flow", frozenset({"output_type"}))
    cfg = FlowConfig(
        input_size=cfg.input_size,
        output_size=cfg.output_size,
        spk_embed_dim=cfg.spk_embed_dim,
        vocab_size=cfg.vocab_size,
        inference_cfg_rate=float(rate),
        encoder=encoder,
        estimator=estimator,
    )
    _check_consistent(cfg, path)
    return cfg


def _check_consistent(cfg: FlowConfig, path: Path) -> None:
    enc, dit = cfg.encoder, cfg.estimator
    if enc.output_size % enc.attention_heads:
        raise AssetError(f"{path}: encoder output_size {enc.output_size} is not divisible by its heads")
    if dit.in_channels != 4 * cfg.output_size:
        raise AssetError(f"{path}: estimator in_channels must be 4 x output_size ({4 * cfg.output_size})")
    if dit.out_channels != cfg.output_size:
        raise AssetError(f"{path}: estimator out_channels must equal output_size ({cfg.output_size})")
    if dit.num_heads * dit.head_dim != dit.hidden_size:
        raise AssetError(f"{path}: estimator num_heads x head_dim must equal hidden_size")


def flow_yaml_text(cfg: FlowConfig) -> str:
    """``flow.yaml`` in the published HyperPyYAML form for ``cfg`` (the tiny-asset generator writes it)."""
    e, d = cfg.encoder, cfg.estimator
    return f"""flow: !new:{FLOW_CLASS}
    input_size: {cfg.input_size}
    output_size: {cfg.output_size}
    spk_embed_dim: {cfg.spk_embed_dim}
    output_type: 'mel'
    vocab_size: {cfg.vocab_size}
    encoder: !new:{ENCODER_CLASS}
        input_size: {e.input_size}
        output_size: {e.output_size}
        input_layer: 'linear'
        pre_lookahead_len: {e.pre_lookahead_len}
        num_blocks: {e.num_blocks}
        num_up_blocks: {e.num_up_blocks}
        up_stride: {e.up_stride}
        up_scale_factor: {e.up_scale_factor}
        attention_heads: {e.attention_heads}
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        key_bias: {str(e.key_bias).lower()}
        linear_units: {e.linear_units}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: {str(e.normalize_before).lower()}
    decoder: !new:{CFM_CLASS}
        inference_cfg_rate: {cfg.inference_cfg_rate}
        estimator: !new:{DIT_CLASS}
            in_channels: {d.in_channels}
            out_channels: {d.out_channels}
            mlp_ratio: {d.mlp_ratio}
            depth: {d.depth}
            num_heads: {d.num_heads}
            head_dim: {d.head_dim}
            hidden_size: {d.hidden_size}
"""
