"""The lockstep codes prompt: a voice stored as its Mimi codes in a ``.safetensors`` file.

``inference.voice_prompts`` writes it from a clip (metadata ``family=lockstep``, tensor ``codes`` [8, F]);
the lockstep engine feeds it (``inference.engines.lockstep_prefill``). The reader sits here, below both, so
neither imports the other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def read_codes_prompt(path: str | Path) -> np.ndarray | None:
    """The Mimi codes [8, F] of a lockstep codes prompt, or None when the file is another kind of prompt."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
            if metadata.get("family") != "lockstep" or "codes" not in handle.keys():
                return None
            return handle.get_tensor("codes")
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path}: not a readable voice prompt ({exc})") from exc
