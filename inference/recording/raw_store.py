"""The raw recordings under one root (``PARLEY_RECORDINGS_DIR``), as the web tier's post-processing reads them.

The service's recorder writes each session's chunks into its folder (``inference.recording.chunks``); the
web tier, on the same host and path, asks whether a folder is finished, reads it, sizes it and deletes it,
through ``inference.api``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

from inference.contracts import ParleyError
from inference.recording import reader
from inference.recording.chunks import folder_size, folder_state, session_folder


class RawRecordings:
    """The session folders under ``root``."""

    def __init__(self, root: Path):
        self.root = root

    def _folder(self, session_id: str) -> Path:
        return session_folder(self.root, session_id)

    def state(self, session_id: str) -> Literal["missing", "open", "finished"]:
        """``finished`` once the session ended (or its killed service was restarted), ``open`` while it runs."""
        return folder_state(self._folder(session_id))

    def read(self, session_id: str) -> reader.RawRecording:
        """The decoded raw recording; ``ParleyError(code="recording_unreadable")`` naming what is wrong when
        nothing is usable."""
        try:
            return reader.read_recording(self._folder(session_id))
        except reader.RawRecordingError as exc:
            raise ParleyError(str(exc), code="recording_unreadable", error_type="server_error") from exc

    def size(self, session_id: str) -> int:
        return folder_size(self._folder(session_id))

    def delete(self, session_id: str) -> None:
        """Remove the raw chunks (after they were processed, or with the recording)."""
        shutil.rmtree(self._folder(session_id), ignore_errors=True)
