"""Moshi / PersonaPlex LM configuration and checkpoint-directory reading.

A checkpoint directory is read the way moshi 0.2.13's ``CheckpointInfo`` reads a Kyutai repository:
``config.json`` holds the ``LMModel`` keyword arguments plus file names (``moshi_name``, ``mimi_name``,
``tokenizer_name``, optional ``mimi_config_name``) and ``lm_gen_config``. A directory without
``config.json`` is a legacy Moshiko repository: the 7B configuration and the default file names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

MOSHI_NAME = "model.safetensors"
MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
TEXT_TOKENIZER_NAME = "tokenizer_spm_32k_3.model"
MOSHIKO_DELAYS = (0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1)

# Keys of config.json that are not LM keyword arguments (popped exactly like CheckpointInfo does).
_NON_LM_KEYS = (
    "moshi_name",
    "mimi_name",
    "mimi_config_name",
    "tokenizer_name",
    "lora_name",
    "model_type",
    "lm_gen_config",
    "tts_config",
    "stt_config",
    "model_id",
    "parley_demo",
)
# LMModel kwargs that carry no weights and no behaviour we need (accepted and ignored).
_IGNORED_LM_KEYS = ("depformer_context", "extra_heads_dim", "quantize", "gradient_checkpointing")
# LMModel kwargs accepted only with the value that means "feature off" (what the published models use).
_NEUTRAL_LM_VALUES: dict[str, Any] = {
    "causal": True,
    "depformer_causal": True,
    "norm_emb": False,
    "text_card_out": None,
    "demux_second_text_stream": False,
    "demux_second_stream": False,
    "depformer_weights_per_step_schedule": None,
    "depformer_low_rank_embeddings": None,
    "depformer_norm": None,
    "existing_text_end_padding_id": 0,
    "extra_heads_num_heads": 0,
    "kv_repeat": 1,
    "depformer_kv_repeat": 1,
    "cross_attention": False,
    "conditioners": None,
    "fuser": None,
}


class CheckpointError(ValueError):
    """A checkpoint directory, config or weight file cannot be used; the message names the culprit."""


@dataclass(frozen=True)
class LMConfig:
    """Shape and behaviour of a Moshi-family LM (the subset of ``LMModel`` kwargs the published models use).

    Attributes:
        dim: temporal transformer width.
        num_heads: temporal attention heads (no GQA).
        num_layers: temporal transformer layers.
        hidden_scale: FFN width factor; ``dim_feedforward = int(hidden_scale * dim)``.
        n_q: audio streams in a frame column (agent + user codebooks).
        dep_q: codebooks the depformer predicts (8 Moshiko, 16 PersonaPlex).
        card: audio codebook size; the embedding tables have ``card + 1`` rows (initial token).
        text_card: text vocabulary size; ``text_emb`` has ``text_card + 1`` rows.
        existing_text_padding_id: text PAD id.
        delays: per-row delays of the ``1 + n_q`` rows.
        context: the checkpoint's attention context, in frames (``kv_window`` says how many frames a pass sees).
        max_period: RoPE max period.
        norm: ``rms_norm_f32`` (eps 1e-8, fp32) or ``rms_norm`` (eps 1e-5).
        depformer_*: the depformer's own widths.
    """

    dim: int = 4096
    num_heads: int = 32
    num_layers: int = 32
    hidden_scale: float = 4.125
    n_q: int = 16
    dep_q: int = 8
    card: int = 2048
    text_card: int = 32000
    existing_text_padding_id: int = 3
    delays: tuple[int, ...] = MOSHIKO_DELAYS
    context: int = 3000
    max_period: float = 10000.0
    norm: str = "rms_norm_f32"
    gating: str = "silu"
    positional_embedding: str = "rope"
    layer_scale: float | None = None
    depformer_dim: int = 1024
    depformer_dim_feedforward: int = int(4.125 * 1024)
    depformer_num_heads: int = 16
    depformer_num_layers: int = 6
    depformer_max_period: float = 10000.0
    depformer_gating: str = "silu"
    depformer_pos_emb: str = "none"
    depformer_layer_scale: float | None = None
    depformer_multi_linear: bool = True
    depformer_weights_per_step: bool = True
    bias_proj: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        checks = [
            (self.dim % self.num_heads == 0, f"dim {self.dim} is not divisible by num_heads {self.num_heads}"),
            (
                self.depformer_dim % self.depformer_num_heads == 0,
                f"depformer_dim {self.depformer_dim} is not divisible by depformer_num_heads",
            ),
            ((self.dim // self.num_heads) % 2 == 0, "RoPE needs an even head dimension"),
            (len(self.delays) == self.n_q + 1, f"expected {self.n_q + 1} delays, got {len(self.delays)}"),
            (all(d >= 0 for d in self.delays), "delays must be >= 0"),
            (0 < self.dep_q <= self.n_q, f"dep_q must be in 1..n_q, got {self.dep_q}"),
            (self.context is not None and self.context > 0, "context must be a positive number of frames"),
            (self.dep_q != self.n_q or self.context >= 2, "a PersonaPlex context must be at least 2 frames"),
            (self.norm in ("rms_norm_f32", "rms_norm"), f"unsupported norm {self.norm!r}"),
            (self.gating == "silu" and self.depformer_gating == "silu", "only SiLU gating is supported"),
            (self.positional_embedding == "rope", f"unsupported positional_embedding {self.positional_embedding!r}"),
            (self.depformer_pos_emb == "none", f"unsupported depformer_pos_emb {self.depformer_pos_emb!r}"),
            (self.layer_scale is None and self.depformer_layer_scale is None, "layer_scale is not supported"),
            (self.depformer_multi_linear and self.depformer_weights_per_step, "depformer must be per-step"),
            (not self.bias_proj, "bias_proj is not supported"),
        ]
        for ok, message in checks:
            if not ok:
                raise CheckpointError(f"config.json: {message}")

    # ---- derived sizes ---------------------------------------------------------------------------

    @property
    def num_codebooks(self) -> int:
        """Rows of a frame column: text + n_q audio."""
        return self.n_q + 1

    @property
    def max_delay(self) -> int:
        return max(self.delays)

    @property
    def dim_feedforward(self) -> int:
        return int(self.hidden_scale * self.dim)

    @property
    def personaplex(self) -> bool:
        """dep_q == n_q: the depformer also predicts the user stream, which is teacher-forced (PersonaPlex)."""
        return self.dep_q == self.n_q

    @property
    def kv_window(self) -> int:
        """Frames a temporal pass attends to (its own included), which is also the KV ring's size.

        moshi 0.2.13 (Moshiko) sees the last ``context`` frames. The NVIDIA/personaplex fork keeps an older
        ``RingKVCache`` that rebuilds slot positions from the offset *after* the write, so the slot about to be
        overwritten next (the oldest frame) gets a future position and is masked out: from pass ``context - 1``
        on, a pass sees only the last ``context - 1`` frames. A ring of ``context - 1`` slots reproduces exactly
        that set of frames at every position, before and after the ring first wraps.
        """
        return self.context - 1 if self.personaplex else self.context

    @staticmethod
    def gated_hidden(dim: int, dim_feedforward: int) -> int:
        """Width of the SiLU-gated hidden layer, as moshi's ``ActivationGating`` computes it."""
        return (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3

    # ---- construction ----------------------------------------------------------------------------

    @classmethod
    def moshiko_7b(cls) -> LMConfig:
        """The published Moshiko 7B configuration (moshi ``loaders._lm_kwargs``)."""
        return cls()

    @classmethod
    def from_lm_kwargs(cls, kwargs: dict[str, Any]) -> LMConfig:
        """Build from ``LMModel`` keyword arguments, missing ones taking the 7B values; unknown keys raise."""
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in known:
                values[key] = value
            elif key in _NEUTRAL_LM_VALUES:
                if value != _NEUTRAL_LM_VALUES[key]:
                    neutral = _NEUTRAL_LM_VALUES[key]
                    raise CheckpointError(f"config.json: {key}={value!r} is not supported (only {neutral!r})")
                extra[key] = value
            elif key in _IGNORED_LM_KEYS:
                extra[key] = value
            else:
                raise CheckpointError(f"config.json: unsupported LM argument {key!r}")
        if "delays" in values:
            values["delays"] = tuple(int(d) for d in values["delays"])
        for key in ("dim", "num_heads", "num_layers", "n_q", "dep_q", "card", "text_card", "context"):
            if key in values and not isinstance(values[key], int):
                raise CheckpointError(f"config.json: {key} must be an integer, got {values[key]!r}")
        return cls(**values, extra=extra)


@dataclass(frozen=True)
class CheckpointInfo:
    """The files and configs of one checkpoint directory.

    Attributes:
        directory: the checkpoint directory.
        lm: the LM configuration.
        moshi_weights: LM safetensors file (fused key layout).
        mimi_weights: Mimi safetensors file.
        tokenizer: SentencePiece model.
        mimi_config: parsed Mimi config JSON, or None for the published Mimi.
        lm_gen_config: generation defaults (temp, temp_text, top_k, top_k_text).
        demo_weights: True when make-checkpoint wrote random weights (``"parley_demo": true``).
        raw_config: config.json as read (None when absent).
    """

    directory: Path
    lm: LMConfig
    moshi_weights: Path
    mimi_weights: Path
    tokenizer: Path
    mimi_config: dict[str, Any] | None
    lm_gen_config: dict[str, Any]
    demo_weights: bool
    raw_config: dict[str, Any] | None


def read_checkpoint_dir(directory: str | Path) -> CheckpointInfo:
    """Read a checkpoint directory laid out like Kyutai's published repositories.

    Raises:
        CheckpointError: missing directory or file, malformed JSON, unsupported configuration.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    config_path = directory / "config.json"
    raw: dict[str, Any] | None = None
    if config_path.exists():
        raw = _read_json(config_path)
        lm_kwargs = dict(raw)
        names = {key: lm_kwargs.pop(key) for key in _NON_LM_KEYS if key in lm_kwargs}
        lm = LMConfig.from_lm_kwargs(lm_kwargs)
        moshi_name = names.get("moshi_name", MOSHI_NAME)
        mimi_name = names.get("mimi_name", MIMI_NAME)
        tokenizer_name = names.get("tokenizer_name", TEXT_TOKENIZER_NAME)
        mimi_config_name = names.get("mimi_config_name")
        lm_gen_config = names.get("lm_gen_config") or {}
        if not isinstance(lm_gen_config, dict):
            raise CheckpointError("config.json: lm_gen_config must be an object")
        demo = bool(names.get("parley_demo", False))
    else:
        lm = LMConfig.moshiko_7b()
        moshi_name, mimi_name, tokenizer_name, mimi_config_name = MOSHI_NAME, MIMI_NAME, TEXT_TOKENIZER_NAME, None
        lm_gen_config, demo = {}, False
    mimi_config = None if mimi_config_name is None else _read_json(_existing(directory, mimi_config_name))
    return CheckpointInfo(
        directory=directory,
        lm=lm,
        moshi_weights=_existing(directory, moshi_name),
        mimi_weights=directory / mimi_name,  # only needed once Mimi is loaded; checked there
        tokenizer=directory / tokenizer_name,
        mimi_config=mimi_config,
        lm_gen_config=dict(lm_gen_config),
        demo_weights=demo,
        raw_config=raw,
    )


def _existing(directory: Path, name: str) -> Path:
    if not isinstance(name, str) or not name or "://" in name:
        raise CheckpointError(f"config.json: file name {name!r} is not a local file name")
    path = directory / name
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist")
    return path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value
