"""Deterministic tiny-checkpoint fill for MiniCPM-o 4.5 (the golden pack's hash formula).

Each tensor is a pure function of (name, element count, seed), so a checkpoint of a few hundred MB is
regenerated in seconds instead of being stored: ``h = crc32(name) + seed``; element ``i`` (1-based,
row-major) hashes ``i * 2654435761 + h`` through two xor-shift/multiply rounds into a uniform value
with unit variance. Norm weights are ``1 + 0.1 x``, everything else ``std * x``.
"""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from inference.models.minicpmo.config import CheckpointError

_MASK32 = np.uint64(0xFFFFFFFF)
_GOLDEN_RATIO_MUL = np.uint64(2654435761)
_MIX_MUL = np.uint64(0x45D9F3B)
_SHIFT = np.uint64(16)
# Elements hashed per block: bounds the uint64 temporaries to ~50 MB whatever the tensor size.
_BLOCK = 1 << 22


def unit_values(name: str, count: int, seed: int) -> np.ndarray:
    """``count`` float32 values in [-sqrt(3), sqrt(3)) for tensor ``name`` (unit variance)."""
    offset = np.uint64((zlib.crc32(name.encode("utf-8")) + seed) % (1 << 32))
    out = np.empty(count, dtype=np.float32)
    scale = np.sqrt(12.0)
    for start in range(0, count, _BLOCK):
        stop = min(start + _BLOCK, count)
        v = np.arange(start + 1, stop + 1, dtype=np.uint64)
        v *= _GOLDEN_RATIO_MUL
        v += offset
        v &= _MASK32
        v ^= v >> _SHIFT
        v *= _MIX_MUL
        v &= _MASK32
        v ^= v >> _SHIFT
        # float64 all the way, rounded to float32 once, as the formula says.
        out[start:stop] = (v.astype(np.float64) / 4294967296.0 - 0.5) * scale
    return out


def is_norm_weight(name: str) -> bool:
    """A weight whose owning module name contains ``norm`` or starts with ``ln_``."""
    parts = name.split(".")
    if len(parts) < 2 or parts[-1] != "weight":
        return False
    owner = parts[-2]
    return "norm" in owner or owner.startswith("ln_")


def fill_tensor(name: str, shape: tuple[int, ...], seed: int, std: float = 0.05) -> np.ndarray:
    """The tensor ``name`` of ``shape`` for ``seed``, float32."""
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    x = unit_values(name, count, seed).reshape(shape)
    if is_norm_weight(name):
        return np.float32(1.0) + np.float32(0.1) * x
    return np.float32(std) * x


def read_keys(path: str | Path) -> list[tuple[str, tuple[int, ...]]]:
    """Parse ``keys.txt`` lines ``NAME<TAB>AxB<TAB>F32`` (``-`` for a scalar)."""
    keys: list[tuple[str, tuple[int, ...]]] = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise CheckpointError(f"{path}:{lineno}: expected NAME<TAB>SHAPE<TAB>DTYPE")
        name, shape_text, dtype = fields
        if dtype != "F32":
            raise CheckpointError(f"{path}:{lineno}: tensor {name!r} has unsupported dtype {dtype}")
        shape = () if shape_text == "-" else tuple(int(s) for s in shape_text.split("x"))
        keys.append((name, shape))
    return keys


def write_weights(keys: list[tuple[str, tuple[int, ...]]], out_file: Path, seed: int, std: float = 0.05) -> int:
    """Write ``model.safetensors`` with every listed tensor; returns the parameter count."""
    tensors = {name: fill_tensor(name, shape, seed, std) for name, shape in keys}
    out_file.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_file))
    return sum(t.size for t in tensors.values())


def make_checkpoint(out_dir: str | Path, *, data_dir: str | Path, seed: int = 1234, std: float = 0.05) -> Path:
    """Write a complete tiny checkpoint directory from ``data_dir`` (config.json, keys.txt, tokenizer/).

    Args:
        out_dir: directory to create or fill.
        data_dir: holds ``config.json``, ``keys.txt`` and ``tokenizer/`` (the golden pack's data files).
        seed: fill seed; the goldens use 1234.
        std: scale of non-norm tensors.

    Returns:
        The checkpoint directory.
    """
    data_dir = Path(data_dir)
    out_dir = Path(out_dir)
    for needed in ("config.json", "keys.txt", "tokenizer"):
        if not (data_dir / needed).exists():
            raise CheckpointError(f"{data_dir}: missing {needed}")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_weights(read_keys(data_dir / "keys.txt"), out_dir / "model.safetensors", seed, std)
    shutil.copy(data_dir / "config.json", out_dir / "config.json")
    for item in sorted((data_dir / "tokenizer").iterdir()):
        shutil.copy(item, out_dir / item.name)
    return out_dir
