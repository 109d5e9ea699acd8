"""Read the Token2Wav asset directory (the published layout) with checks that name the failing file.

Layout: ``flow.yaml`` (architecture), ``flow.pt`` and ``hift.pt`` (plain state dicts), ``campplus.onnx``
(speaker embedding), ``speech_tokenizer_v2_25hz.onnx`` (S3 tokenizer). The ``.pt`` files are read with
``weights_only=True`` (a pickle that carries code is refused), every tensor's name and shape is checked
against the architecture, and the ONNX files must have the input and output signatures the vocoder feeds.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch import nn

from inference.models.minicpmo.token2wav.config import AssetError, FlowConfig, read_flow_config
from inference.models.minicpmo.token2wav.flow import CausalFlow
from inference.models.minicpmo.token2wav.hift import HiFT

FLOW_YAML, FLOW_PT, HIFT_PT = "flow.yaml", "flow.pt", "hift.pt"
CAMPPLUS_ONNX, TOKENIZER_ONNX = "campplus.onnx", "speech_tokenizer_v2_25hz.onnx"
ASSET_FILES = (FLOW_YAML, FLOW_PT, HIFT_PT, CAMPPLUS_ONNX, TOKENIZER_ONNX)


def check_asset_dir(asset_dir: Path) -> None:
    """Every published file is present, or ``AssetError`` naming the first missing one."""
    if not asset_dir.is_dir():
        raise AssetError(f"{asset_dir}: Token2Wav asset directory not found")
    for name in ASSET_FILES:
        if not (asset_dir / name).is_file():
            raise AssetError(f"{asset_dir / name}: missing (the Token2Wav assets need {', '.join(ASSET_FILES)})")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A ``.pt`` state dict read with ``weights_only=True``: tensors only, no code."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise AssetError(f"{path}: missing") from exc
    except pickle.UnpicklingError as exc:
        raise AssetError(f"{path}: refused: not a plain tensor state dict (weights_only load failed: {exc})") from exc
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise AssetError(f"{path}: unreadable ({exc})") from exc
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise AssetError(f"{path}: expected a dict of tensors")
    return obj


def _fold_weight_norm(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weight-normed convs are stored as (g, v) pairs, old or parametrization style; fold them into weights."""
    out: dict[str, torch.Tensor] = {}
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in sd.items():
        for g_suffix, v_suffix in (
            (".weight_g", ".weight_v"),
            (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
        ):
            if key.endswith(g_suffix):
                pairs.setdefault(key[: -len(g_suffix)], {})["g"] = value
                break
            if key.endswith(v_suffix):
                pairs.setdefault(key[: -len(v_suffix)], {})["v"] = value
                break
        else:
            out[key] = value
    for base, gv in pairs.items():
        if set(gv) != {"g", "v"}:
            raise KeyError(f"{base}: weight norm pair incomplete")
        out[base + ".weight"] = torch._weight_norm(gv["v"].float(), gv["g"].float(), 0)
    return out


def load_strict(module: nn.Module, sd: dict[str, torch.Tensor], path: Path) -> None:
    """Load with every name and shape checked; ``AssetError`` names the file and the first bad tensor."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(set(expected) - set(sd))
    if missing:
        raise AssetError(f"{path}: missing tensor {missing[0]!r} ({len(missing)} missing in all)")
    unexpected = sorted(set(sd) - set(expected))
    if unexpected:
        raise AssetError(f"{path}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} in all)")
    for name, shape in expected.items():
        if tuple(sd[name].shape) != shape:
            raise AssetError(f"{path}: tensor {name!r} has shape {tuple(sd[name].shape)}, expected {shape}")
    module.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)


def load_flow(asset_dir: Path) -> CausalFlow:
    """``flow.yaml`` + ``flow.pt`` -> the flow decoder (float32, CPU, eval)."""
    cfg: FlowConfig = read_flow_config(asset_dir / FLOW_YAML)
    flow = CausalFlow(cfg)
    load_strict(flow, read_state_dict(asset_dir / FLOW_PT), asset_dir / FLOW_PT)
    return flow.eval()


def hift_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """``hift.pt`` with the ``generator.`` prefix dropped and weight norm folded."""
    sd = {k.removeprefix("generator."): v for k, v in read_state_dict(path).items()}
    try:
        return _fold_weight_norm(sd)
    except (KeyError, RuntimeError) as exc:
        raise AssetError(f"{path}: {exc}") from exc


def load_hift(asset_dir: Path) -> HiFT:
    """``hift.pt`` -> HiFT; channel widths come from ``conv_pre`` and the F0 predictor's first conv."""
    path = asset_dir / HIFT_PT
    sd = hift_state_dict(path)
    try:
        base = int(sd["conv_pre.weight"].shape[0])
        f0_ch = int(sd["f0_predictor.condnet.0.weight"].shape[0])
    except KeyError as exc:
        raise AssetError(f"{path}: missing tensor {exc.args[0]!r}") from exc
    if base % 8 or base < 8:
        raise AssetError(f"{path}: conv_pre has {base} channels, expected a multiple of 8")
    hift = HiFT(base_channels=base, f0_channels=f0_ch)
    load_strict(hift, sd, path)
    return hift.eval()


# Signatures the vocoder feeds: (rank, element type) per input and output, in order.
ONNX_SIGNATURES = {
    CAMPPLUS_ONNX: ([(3, "float")], [(2, "float")]),  # fbank [B, T, 80] -> embedding [B, 192]
    TOKENIZER_ONNX: ([(3, "float"), (1, "int32")], [(2, "int32")]),  # feats [B, 128, T], lengths -> tokens
}
_ONNX_TYPES = {1: "float", 6: "int32", 7: "int64"}


def check_onnx(path: Path) -> None:
    """The ONNX file parses and has the inputs and outputs the vocoder feeds, or ``AssetError`` naming it."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except FileNotFoundError as exc:
        raise AssetError(f"{path}: missing") from exc
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and others for a corrupt file
        raise AssetError(f"{path}: not a readable ONNX model ({exc})") from exc
    want_in, want_out = ONNX_SIGNATURES[path.name]
    inits = {i.name for i in model.graph.initializer}

    def sig(values) -> list[tuple[int, str]]:
        return [
            (len(v.type.tensor_type.shape.dim), _ONNX_TYPES.get(v.type.tensor_type.elem_type, "other"))
            for v in values
            if v.name not in inits
        ]

    got_in, got_out = sig(model.graph.input), sig(model.graph.output)
    if got_in != want_in or got_out[: len(want_out)] != want_out:
        raise AssetError(f"{path}: inputs {got_in} / outputs {got_out} (rank, type), expected {want_in} / {want_out}")
