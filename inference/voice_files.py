"""Voice files the inference service reads: only files inside its voices storage roots.

A voice reaches the service as a ``VoiceRef`` naming a file the web tier stored. Over the service's
socket that path comes from a peer, so the service reads it only when it resolves (symlinks and
``..`` followed) inside one of ``InferenceConfig.voice_roots``: no peer can make an engine open
``/etc/shadow`` or another user's recording as a "voice".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from inference.contracts import ParleyError, VoiceRef


def checked_voice(voice: VoiceRef | None, roots: Sequence[Path]) -> VoiceRef | None:
    """``voice`` with its path resolved, or ParleyError ``voice_not_found`` for a path outside ``roots``."""
    if voice is None or voice.path is None:
        return voice
    resolved = Path(voice.path).resolve()
    if not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        raise ParleyError(
            f"voice {voice.voice_id!r}: its file is not in the voices storage", code="voice_not_found", param="voice"
        )
    return dataclasses.replace(voice, path=resolved)
