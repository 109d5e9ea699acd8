"""The one strict reader of safetensors files for every model family: every tensor (or the named ones) of one
file, with a missing, truncated or corrupt file turned into the caller's own typed error naming the file.

Each loader passes its error class (``CheckpointError``, ``MimiLoadError`` ...), so its callers keep catching
what they caught before; the messages say the same things in one wording.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open


def read_safetensors_file(
    path: str | Path,
    error: type[Exception],
    *,
    names: Iterable[str] | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Tensors of ``path`` (all, or ``names``, each of which must be present) on ``device``.

    Raises:
        error: the file is missing, is not a file, is not valid safetensors, or lacks one of ``names``.
    """
    try:
        file = Path(path)
    except TypeError as exc:
        raise error(f"weight file path must be a path, got {type(path).__name__}") from exc
    if not file.is_file():
        raise error(f"weight file {str(file)!r} does not exist or is not a file")
    try:
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            present = list(f.keys())
            wanted = present if names is None else list(names)
            missing = sorted(set(wanted) - set(present))
            if missing:
                raise error(f"{file.name}: lacks tensor(s) {missing[:5]} (an index lists them)")
            return {name: f.get_tensor(name) for name in wanted}
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        if isinstance(exc, error):
            raise
        raise error(f"{str(file)!r} is not a readable safetensors file (truncated or corrupt?): {exc}") from exc
