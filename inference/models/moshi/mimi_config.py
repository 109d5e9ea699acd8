"""Mimi's configuration: the SEANet, quantizer and transformer hyper-parameters of one codec, from a config dict.

Kept apart from the codec (``inference.models.moshi.mimi``) so that reading and checking a configuration needs no
torch; ``MimiConfig.from_dict`` refuses unknown keys and options this codec does not implement with a
``MimiConfigError`` naming them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class MimiConfigError(ValueError):
    """A Mimi configuration is malformed or asks for an option this codec does not implement."""


def _section_from_dict(cls: type, d: Any, section: str) -> Any:
    if not isinstance(d, dict):
        raise MimiConfigError(f"mimi config section {section!r} must be an object, got {type(d).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise MimiConfigError(f"mimi config section {section!r}: unknown key(s) {unknown}")
    return cls(**d)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise MimiConfigError(message)


def is_integer(value: Any) -> bool:
    """An int that is not a bool (``True`` is an int to Python, never a size here)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class SeanetConfig:
    """SEANet encoder/decoder hyper-parameters (moshi `SEANetEncoder` kwargs)."""

    channels: int = 1
    dimension: int = 512
    causal: bool = True
    n_filters: int = 64
    n_residual_layers: int = 1
    activation: str = "ELU"
    compress: int = 2
    dilation_base: int = 2
    disable_norm_outer_blocks: int = 0
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 3
    norm: str = "none"
    pad_mode: str = "constant"
    ratios: list[int] = field(default_factory=lambda: [8, 6, 5, 4])
    true_skip: bool = True

    def validate(self) -> None:
        for name in ("channels", "dimension", "n_filters", "n_residual_layers", "compress", "dilation_base",
                     "kernel_size", "residual_kernel_size", "last_kernel_size"):  # fmt: skip
            value = getattr(self, name)
            _check(is_integer(value) and value >= 1, f"seanet.{name} must be a positive integer, got {value!r}")
        _check(self.causal is True, "seanet.causal must be true: only the causal (streaming) Mimi is supported")
        _check(self.activation == "ELU", f"seanet.activation {self.activation!r} is not supported (only 'ELU')")
        _check(self.norm == "none", f"seanet.norm {self.norm!r} is not supported (only 'none'; fold weight_norm)")
        _check(self.pad_mode == "constant", f"seanet.pad_mode {self.pad_mode!r} is not supported (only 'constant')")
        _check(self.true_skip is True, "seanet.true_skip must be true (conv shortcuts are not supported)")
        _check(
            isinstance(self.ratios, list)
            and len(self.ratios) > 0
            and all(is_integer(r) and r >= 1 for r in self.ratios),
            f"seanet.ratios must be a non-empty list of positive integers, got {self.ratios!r}",
        )
        _check(self.n_filters * 2 ** len(self.ratios) % self.compress == 0, "seanet widths must divide by compress")

    @property
    def hop_length(self) -> int:
        return math.prod(self.ratios)


@dataclass
class QuantizerConfig:
    """Split residual vector quantiser: `n_q_semantic` semantic codebooks then `n_q - n_q_semantic` acoustic."""

    dimension: int = 256
    n_q: int = 32
    bins: int = 2048
    input_dimension: int = 512
    output_dimension: int = 512
    n_q_semantic: int = 1

    def validate(self) -> None:
        for name in ("dimension", "n_q", "bins", "input_dimension", "output_dimension", "n_q_semantic"):
            value = getattr(self, name)
            _check(is_integer(value) and value >= 1, f"quantizer.{name} must be a positive integer, got {value!r}")
        _check(self.n_q > self.n_q_semantic, "quantizer.n_q must exceed n_q_semantic")


@dataclass
class TransformerConfig:
    """Encoder/decoder transformer (moshi `ProjectedTransformer` kwargs as used by Mimi)."""

    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 8
    causal: bool = True
    layer_scale: float | None = 0.01
    context: int = 250
    conv_layout: bool = True
    max_period: float = 10000
    gating: str = "none"
    norm: str = "layer_norm"
    positional_embedding: str = "rope"
    dim_feedforward: int = 2048
    input_dimension: int = 512
    output_dimensions: list[int] = field(default_factory=lambda: [512])

    def validate(self) -> None:
        for name in ("d_model", "num_heads", "num_layers", "context", "dim_feedforward", "input_dimension"):
            value = getattr(self, name)
            _check(is_integer(value) and value >= 1, f"transformer.{name} must be a positive integer, got {value!r}")
        _check(self.d_model % self.num_heads == 0, "transformer.d_model must divide by num_heads")
        _check((self.d_model // self.num_heads) % 2 == 0, "transformer head dim must be even for RoPE")
        _check(self.causal is True, "transformer.causal must be true")
        _check(self.conv_layout is True, "transformer.conv_layout must be true")
        _check(self.gating == "none", f"transformer.gating {self.gating!r} is not supported (only 'none')")
        _check(self.norm == "layer_norm", f"transformer.norm {self.norm!r} is not supported (only 'layer_norm')")
        _check(self.positional_embedding == "rope", "transformer.positional_embedding must be 'rope'")
        _check(
            isinstance(self.output_dimensions, list) and len(self.output_dimensions) == 1,
            f"transformer.output_dimensions must hold exactly one dimension, got {self.output_dimensions!r}",
        )
        _check(isinstance(self.max_period, int | float) and self.max_period > 0, "transformer.max_period must be > 0")
        _check(
            self.layer_scale is None or isinstance(self.layer_scale, int | float),
            "transformer.layer_scale must be a number or null",
        )


@dataclass
class MimiConfig:
    """Whole-codec configuration in the `mimi_config.json` form (seanet / quantizer / transformer sections)."""

    sample_rate: int = 24000
    channels: int = 1
    frame_rate: float = 12.5
    seanet: SeanetConfig = field(default_factory=SeanetConfig)
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)
    transformer: TransformerConfig = field(default_factory=TransformerConfig)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MimiConfig:
        """Build and validate a config from the `mimi_config.json` form; raises `MimiConfigError`."""
        if not isinstance(d, dict):
            raise MimiConfigError(f"mimi config must be an object, got {type(d).__name__}")
        top = {"sample_rate", "channels", "frame_rate", "seanet", "quantizer", "transformer"}
        unknown = sorted(set(d) - top)
        if unknown:
            raise MimiConfigError(f"mimi config: unknown key(s) {unknown}")
        missing = sorted({"seanet", "quantizer", "transformer"} - set(d))
        if missing:
            raise MimiConfigError(f"mimi config: missing section(s) {missing}")
        try:
            config = cls(
                sample_rate=d.get("sample_rate", 24000),
                channels=d.get("channels", 1),
                frame_rate=d.get("frame_rate", 12.5),
                seanet=_section_from_dict(SeanetConfig, d["seanet"], "seanet"),
                quantizer=_section_from_dict(QuantizerConfig, d["quantizer"], "quantizer"),
                transformer=_section_from_dict(TransformerConfig, d["transformer"], "transformer"),
            )
        except TypeError as exc:  # a section given as something dataclass() cannot take
            raise MimiConfigError(f"mimi config: {exc}") from exc
        config.validate()
        return config

    @classmethod
    def kyutai_default(cls) -> MimiConfig:
        """The published 24 kHz / 12.5 Hz Mimi (moshi `loaders._mimi_config`)."""
        return cls()

    @classmethod
    def tiny(cls) -> MimiConfig:
        """The tiny test Mimi (reference §7; the PersonaPlex golden pack's `mimi_config.json`)."""
        return cls(
            seanet=SeanetConfig(dimension=64, n_filters=8),
            quantizer=QuantizerConfig(dimension=32, n_q=16, input_dimension=64, output_dimension=64),
            transformer=TransformerConfig(
                d_model=64, num_heads=4, num_layers=2, dim_feedforward=128, input_dimension=64, output_dimensions=[64]
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """The `mimi_config.json` form (without `n_q_semantic` when it has its default of 1)."""
        d = asdict(self)
        if d["quantizer"]["n_q_semantic"] == 1:
            del d["quantizer"]["n_q_semantic"]
        return d

    def validate(self) -> None:
        _check(is_integer(self.sample_rate) and self.sample_rate > 0, "sample_rate must be a positive integer")
        _check(self.channels == 1, f"only mono Mimi is supported, got channels={self.channels!r}")
        _check(isinstance(self.frame_rate, int | float) and self.frame_rate > 0, "frame_rate must be > 0")
        self.seanet.validate()
        self.quantizer.validate()
        self.transformer.validate()
        _check(self.seanet.channels == self.channels, "seanet.channels must equal channels")
        dim = self.seanet.dimension
        _check(self.quantizer.input_dimension == dim, "quantizer.input_dimension must equal seanet.dimension")
        _check(self.quantizer.output_dimension == dim, "quantizer.output_dimension must equal seanet.dimension")
        _check(self.transformer.input_dimension == dim, "transformer.input_dimension must equal seanet.dimension")
        _check(self.transformer.output_dimensions == [dim], "transformer.output_dimensions must be [seanet.dimension]")
        frame_size = self.sample_rate / self.frame_rate
        _check(frame_size == int(frame_size), "sample_rate / frame_rate must be an integer frame size")
        stride = frame_size / self.seanet.hop_length
        _check(
            stride == int(stride) and stride >= 1,
            f"frame size {frame_size:g} must be a multiple of the SEANet hop {self.seanet.hop_length}",
        )

    @property
    def frame_size(self) -> int:
        return int(self.sample_rate / self.frame_rate)

    @property
    def resample_stride(self) -> int:
        """Stride of the learnt down/up-sampling between the SEANet rate (25 Hz) and the frame rate."""
        return self.frame_size // self.seanet.hop_length
