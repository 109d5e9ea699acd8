"""Loading a Moshi / PersonaPlex LM from a safetensors file in the published fused key layout.

Checks are strict: every expected key present, no unexpected key, every shape exact; each error names the
key. A dep_q 16 configuration may load a dep_q 8 (Moshiko) file: the depformer is widened the way
PersonaPlex's loader does it (per-step attention stacks repeated, steps k+8 copied from steps k).
No pickle is ever loaded here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path

import torch

from inference.models.moshi.config import CheckpointError, LMConfig
from inference.models.moshi.lm import MoshiLM
from inference.models.safetensors_files import read_safetensors_file

logger = logging.getLogger(__name__)

_PER_STEP_GROUPS = ("gating", "linears", "depformer_in", "depformer_emb")


def read_safetensors(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read every tensor of a safetensors file, turning any format problem into a CheckpointError."""
    return read_safetensors_file(path, CheckpointError, device=device)


def widen_depformer(state: dict[str, torch.Tensor], expected: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Fill a dep_q 16 depformer from a dep_q 8 file (PersonaPlex loader semantics).

    Per-step attention stacks that are too short are repeated along dim 0; missing per-step modules
    ``gating.{k}``, ``linears.{k}``, ``depformer_in.{k}``, ``depformer_emb.{k}`` (k >= 8) are copied from k - 8.
    ``depformer_emb.7`` (the agent cb7 -> user cb0 step) has no counterpart in an 8-step file and is zero.
    """
    out = dict(state)
    for key, shape in expected.items():
        tensor = out.get(key)
        if tensor is not None and key.startswith("depformer.") and ".self_attn." in key:
            if tensor.shape[0] < shape[0] and shape[0] % tensor.shape[0] == 0 and tensor.shape[1:] == shape[1:]:
                out[key] = tensor.repeat(shape[0] // tensor.shape[0], *([1] * (tensor.dim() - 1)))
                logger.info("moshi.load.widen", extra={"key": key})
    for key, shape in expected.items():
        if key in out:
            continue
        match = re.search(r"(?:^|\.)(" + "|".join(_PER_STEP_GROUPS) + r")\.(\d+)\.", key)
        if match is None:
            continue
        index = int(match.group(2))
        if index >= 8:
            source = key[: match.start(2)] + str(index - 8) + key[match.end(2) :]
            if source in out:
                out[key] = out[source]
                continue
        if key.startswith("depformer_emb."):
            out[key] = torch.zeros(shape, dtype=next(iter(state.values())).dtype)
            logger.warning("moshi.load.zero_fill", extra={"key": key})
    return out


def key_set_mismatch(expected: Iterable[str], found: Iterable[str]) -> str | None:
    """``missing key 'k' (and N more)``, else ``unexpected key 'k' (and N more)``, else None (first in sort order)."""
    expected, found = set(expected), set(found)
    for kind, keys in (("missing", expected - found), ("unexpected", found - expected)):
        if keys:
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            return f"{kind} key {min(keys)!r}{more}"
    return None


def load_lm_state(
    lm: MoshiLM, state: dict[str, torch.Tensor], *, source: str = "state", allow_widen: bool = True
) -> None:
    """Copy ``state`` into ``lm`` after strict key and shape checks (errors name the key)."""
    expected = {k: v.shape for k, v in lm.state_dict().items()}
    if allow_widen and lm.config.dep_q == 16 and _looks_like_dep_q8(state):
        state = widen_depformer(state, expected)
    mismatch = key_set_mismatch(expected, state)
    if mismatch:
        raise CheckpointError(f"{source}: {mismatch}")
    for key, shape in expected.items():
        if tuple(state[key].shape) != tuple(shape):
            raise CheckpointError(f"{source}: key {key!r} has shape {tuple(state[key].shape)}, expected {tuple(shape)}")
        if not state[key].dtype.is_floating_point:
            raise CheckpointError(f"{source}: key {key!r} has dtype {state[key].dtype}, expected a float")
    lm.load_state_dict(state, strict=True, assign=True)


def load_lm(
    path: str | Path,
    config: LMConfig,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> MoshiLM:
    """Build a ``MoshiLM`` for ``config`` and load ``path`` into it (eval mode, on ``device`` in ``dtype``)."""
    state = read_safetensors(path)
    with torch.device("meta"):
        lm = MoshiLM(config)  # no memory until the checkpoint's tensors are assigned
    state = {k: v.to(dtype) if v.dtype.is_floating_point else v for k, v in state.items()}
    load_lm_state(lm, state, source=str(path))
    return lm.to(device=device).eval().requires_grad_(False)


def _looks_like_dep_q8(state: dict[str, torch.Tensor]) -> bool:
    return "linears.7.weight" in state and "linears.8.weight" not in state
