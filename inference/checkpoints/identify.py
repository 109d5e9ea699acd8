"""What a checkpoint folder is and whether its tensors fit the layout, read from headers and small files only.

``inspect_checkpoint(folder)`` names the family (``moshi``, ``personaplex``, ``minicpmo``) from its config,
builds the family's model on the ``meta`` device (shapes, no memory) and compares every tensor name, shape and
dtype of the safetensors headers against it; the weights themselves are never read. Every fault becomes a
``Finding`` naming the file, so one run lists all of them instead of stopping at the first.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.checkpoints.safetensors_header import FLOAT_DTYPES, HeaderError, TensorEntry, read_header

FAMILIES = ("moshi", "personaplex", "minicpmo")
VOICE_SUFFIXES = (".pt", ".safetensors", ".wav", ".flac")


@dataclass(frozen=True)
class Finding:
    """One thing wrong with one file of the checkpoint."""

    file: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: {self.problem}"


@dataclass
class CheckpointReport:
    """What ``inspect_checkpoint`` found; ``ok`` when there are no findings."""

    directory: Path
    family: str | None = None
    sizes: dict[str, Any] = field(default_factory=dict)
    dtypes: Counter = field(default_factory=Counter)  # safetensors dtype -> tensors of the model's weights
    parameters: int = 0
    tokenizer: str = "?"
    codec: str = "?"
    vocoder: str = "-"
    voice_prompts: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    lm_config: Any = None  # the family's config object (LMConfig or MiniCPMOConfig), for the capacity plan

    @property
    def ok(self) -> bool:
        return not self.findings

    def fault(self, file: Path | str, problem: str) -> None:
        name = file.name if isinstance(file, Path) else file
        self.findings.append(Finding(name, problem))


def detect_family(directory: Path) -> str:
    """``minicpmo`` or ``moshi`` (refined to ``personaplex`` from dep_q once the config is read).

    Raises:
        ValueError: the folder is neither (the message says what it lacks).
    """
    config = directory / "config.json"
    if config.is_file():
        try:
            raw = json.loads(config.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"config.json: not readable JSON ({exc})") from exc
        if isinstance(raw, dict) and (
            raw.get("model_type") == "minicpmo" or "MiniCPMO" in raw.get("architectures", [])
        ):
            return "minicpmo"
        return "moshi"
    if (directory / "model.safetensors").is_file():
        return "moshi"  # a legacy Kyutai repository: no config.json, the 7B configuration
    raise ValueError("neither config.json nor model.safetensors: not a checkpoint folder")


def inspect_checkpoint(directory: str | Path) -> CheckpointReport:
    """Identify and check ``directory`` without loading any weights."""
    directory = Path(directory)
    report = CheckpointReport(directory)
    if not directory.is_dir():
        report.fault(str(directory), "is not a folder")
        return report
    try:
        family = detect_family(directory)
    except ValueError as exc:
        report.fault(directory, str(exc))
        return report
    if family == "minicpmo":
        _inspect_minicpmo(directory, report)
    else:
        _inspect_moshi(directory, report)
    return report


def compare_layout(
    report: CheckpointReport, expected: dict[str, tuple[int, ...]], found: dict[str, tuple[Path, TensorEntry]]
) -> None:
    """A finding for every missing, unexpected, misshapen or non-float tensor, naming the file holding it."""
    for name in sorted(set(expected) - set(found)):
        report.fault(_weights_file(found), f"missing tensor {name!r} (shape {expected[name]})")
    for name in sorted(set(found) - set(expected)):
        report.fault(found[name][0], f"unexpected tensor {name!r}")
    for name in sorted(set(expected) & set(found)):
        path, entry = found[name]
        if entry.shape != tuple(expected[name]):
            report.fault(path, f"tensor {name!r} has shape {entry.shape}, expected {tuple(expected[name])}")
        elif entry.dtype not in FLOAT_DTYPES:
            report.fault(path, f"tensor {name!r} has dtype {entry.dtype}, expected a float")
    report.dtypes.update(entry.dtype for _, entry in found.values())
    report.parameters = sum(entry.numel for name, (_, entry) in found.items() if name in expected)


def _weights_file(found: dict[str, tuple[Path, TensorEntry]]) -> str:
    files = sorted({path.name for path, _ in found.values()})
    return files[0] if len(files) == 1 else "weights"


def _header(report: CheckpointReport, path: Path) -> dict[str, TensorEntry] | None:
    try:
        return read_header(path)
    except HeaderError as exc:
        report.fault(path, str(exc).removeprefix(f"{path}: "))
        return None


# ---- Moshi / PersonaPlex -------------------------------------------------------------------------------


def _inspect_moshi(directory: Path, report: CheckpointReport) -> None:
    import torch

    from inference.models.moshi.config import CheckpointError, read_checkpoint_dir
    from inference.models.moshi.lm import MoshiLM

    try:
        info = read_checkpoint_dir(directory)
    except CheckpointError as exc:
        report.family = "moshi"
        report.fault(directory, str(exc))
        return
    lm = info.lm
    report.family = "personaplex" if lm.personaplex else "moshi"
    report.lm_config = lm
    report.sizes = {
        "dim": lm.dim, "layers": lm.num_layers, "heads": lm.num_heads, "dep_q": lm.dep_q, "n_q": lm.n_q,
        "text_card": lm.text_card, "context_frames": lm.context, "kv_window_frames": lm.kv_window,
    }  # fmt: skip
    header = _header(report, info.moshi_weights)
    if header is not None:
        config = lm
        if lm.dep_q == 16 and "linears.7.weight" in header and "linears.8.weight" not in header:
            # a dep_q 8 (Moshiko) file in a dep_q 16 config: the loader widens it (loading.widen_depformer)
            config = dataclasses.replace(lm, dep_q=8)
            report.sizes["widened_from_dep_q"] = 8
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in MoshiLM(config).state_dict().items()}
        compare_layout(report, expected, {k: (info.moshi_weights, v) for k, v in header.items()})
    _moshi_codec(report, info.mimi_weights)
    _moshi_tokenizer(report, info.tokenizer, lm.text_card)
    report.voice_prompts = _voice_prompts(directory)


def _moshi_codec(report: CheckpointReport, path: Path) -> None:
    from inference.models.moshi.mimi_loading import MimiLoadError, detect_layout

    if not path.is_file():
        report.codec = "missing"
        report.fault(path, "Mimi codec weights are missing")
        return
    header = _header(report, path)
    if header is None:
        report.codec = "unreadable"
        return
    try:
        layout = detect_layout(header)
    except MimiLoadError as exc:
        report.codec = "unrecognised"
        report.fault(path, str(exc))
        return
    params = sum(e.numel for e in header.values())
    report.codec = f"Mimi ({layout} layout, {len(header)} tensors, {params / 1e6:.1f} M parameters)"


def _moshi_tokenizer(report: CheckpointReport, path: Path, text_card: int) -> None:
    import sentencepiece as spm

    if not path.is_file():
        report.tokenizer = "missing"
        report.fault(path, "text tokenizer is missing")
        return
    try:
        pieces = spm.SentencePieceProcessor(model_file=str(path)).get_piece_size()
    except (RuntimeError, OSError) as exc:
        report.tokenizer = "foreign"
        report.fault(path, f"not a SentencePiece model ({str(exc).splitlines()[0]})")
        return
    report.tokenizer = f"SentencePiece, {pieces} pieces"
    if pieces != text_card:
        report.fault(path, f"SentencePiece model has {pieces} pieces but the model's text_card is {text_card} "
                           "(a tokenizer from another model?)")  # fmt: skip


def _voice_prompts(directory: Path) -> list[str]:
    found = [p.name for p in sorted(directory.glob("voices.t*gz"))]
    for folder in (directory / "voices", directory / "voice_prompts"):
        if folder.is_dir():
            found += [f"{folder.name}/{p.name}" for p in sorted(folder.iterdir()) if p.suffix in VOICE_SUFFIXES]
    return found


# ---- MiniCPM-o 4.5 -------------------------------------------------------------------------------------


def _inspect_minicpmo(directory: Path, report: CheckpointReport) -> None:
    import torch

    from inference.models.minicpmo.config import CheckpointError, MiniCPMOConfig
    from inference.models.minicpmo.loading import INDEX_FILE, SINGLE_FILE, build_parts, expected_shapes
    from inference.models.minicpmo.vocoder import ASSET_SUBDIR

    report.family = "minicpmo"
    try:
        cfg = MiniCPMOConfig.from_dir(directory)
    except CheckpointError as exc:
        report.fault(directory / "config.json", str(exc))
        return
    report.lm_config = cfg
    report.sizes = {
        "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "vocab": cfg.vocab_size,
        "max_positions": cfg.max_position_embeddings,
    }  # fmt: skip
    found: dict[str, tuple[Path, TensorEntry]] = {}
    lost_shard = False
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards: dict[str, list[str]] = {}
            for name, shard in weight_map.items():
                shards.setdefault(shard, []).append(name)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            report.fault(index, f"not a safetensors index ({exc!r})")
            return
        lost_shard = False
        for shard, names in sorted(shards.items()):
            path = directory / shard
            if not path.is_file():
                report.fault(path, f"shard listed by {INDEX_FILE} is missing ({len(names)} tensors, e.g. {names[0]!r})")
                lost_shard = True
                continue
            header = _header(report, path)
            if header is None:
                lost_shard = True
                continue
            for name in names:
                if name not in header:
                    report.fault(path, f"lacks tensor {name!r} that {INDEX_FILE} places in it")
            found.update({k: (path, v) for k, v in header.items()})
    elif (directory / SINGLE_FILE).is_file():
        header = _header(report, directory / SINGLE_FILE)
        if header is None:
            return
        found = {k: (directory / SINGLE_FILE, v) for k, v in header.items()}
    else:
        report.fault(directory, f"neither {SINGLE_FILE} nor {INDEX_FILE}")
        return
    with torch.device("meta"):
        expected = expected_shapes(build_parts(cfg))
    if index.is_file() and lost_shard:  # the lost shard is named once, not each of its tensors
        expected = {k: v for k, v in expected.items() if k in found}
    compare_layout(report, expected, found)
    _minicpmo_tokenizer(report, directory, cfg.vocab_size)
    assets = directory / ASSET_SUBDIR
    report.codec = "audio in: Whisper-style encoder (in the weights); audio out: CosyVoice2 tokens"
    if assets.is_dir():
        report.vocoder = f"Token2Wav assets in {ASSET_SUBDIR} ({len(list(assets.iterdir()))} files)"
    else:
        report.vocoder = f"none in {ASSET_SUBDIR} (silent vocoder unless PARLEY_VOCODER_DIR is set)"
    report.voice_prompts = _voice_prompts(directory)


def _minicpmo_tokenizer(report: CheckpointReport, directory: Path, vocab_size: int) -> None:
    files = ("vocab.json", "merges.txt", "tokenizer_config.json")
    missing = [name for name in files if not (directory / name).is_file()]
    if missing:
        report.tokenizer = "missing"
        for name in missing:
            report.fault(name, "tokenizer file is missing")
        return
    try:
        vocab = json.loads((directory / "vocab.json").read_text())
        tok_cfg = json.loads((directory / "tokenizer_config.json").read_text())
        added_path = directory / "added_tokens.json"
        added = json.loads(added_path.read_text()) if added_path.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        report.tokenizer = "unreadable"
        report.fault(directory, f"tokenizer files are not readable JSON ({exc})")
        return
    if not isinstance(vocab, dict) or not isinstance(added, dict):
        report.tokenizer = "foreign"
        report.fault("vocab.json", "not a BPE vocabulary (a JSON object of token -> id)")
        return
    largest = max([*vocab.values(), *added.values()], default=-1)
    report.tokenizer = f"{tok_cfg.get('tokenizer_class', '?')}, {len(vocab)} + {len(added)} added tokens"
    if largest >= vocab_size:
        report.fault("vocab.json", f"token id {largest} is past the model's vocab_size {vocab_size} "
                                   "(a tokenizer from another model?)")  # fmt: skip
    elif "<|im_start|>" not in {**vocab, **added}:
        report.fault("vocab.json", "has no <|im_start|> token: not the MiniCPM-o (Qwen) tokenizer")


def family_of(directory: str | Path) -> str:
    """``moshi``, ``personaplex`` or ``minicpmo`` from the folder's config alone (no weights read).

    Raises:
        ValueError: not a checkpoint folder, or an unreadable config (the message says which).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a folder")
    family = detect_family(directory)
    if family == "minicpmo":
        return family
    from inference.models.moshi.config import read_checkpoint_dir

    return "personaplex" if read_checkpoint_dir(directory).lm.personaplex else "moshi"
