"""Whether a session is recorded, and starting its recording: what a service's sessions share.

The deployment's ``PARLEY_RECORD`` (``InferenceConfig.record``) decides first: ``on`` records every
session, ``off`` none; ``auto`` follows each session's ``record`` wish (on unless the caller asked
otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inference.recording.recorder import Recorder, SessionRecording


@dataclass(frozen=True)
class RecordingPolicy:
    """A service's recording policy and its recorder (None when the policy is ``off``)."""

    policy: str = "off"
    recorder: Recorder | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # engine, checkpoint, rates: the same for every session

    def records(self, requested: bool) -> bool:
        if self.recorder is None:
            return False
        return {"on": True, "off": False}.get(self.policy, requested)

    def begin(self, session_id: str, *, video: bool = True, **session_meta: Any) -> SessionRecording:
        """``video``: keep the camera frames the engine sees (the caller's own choice; audio is recorded anyway)."""
        assert self.recorder is not None, "begin() only for sessions that records() said yes to"
        return self.recorder.begin(session_id, {**self.meta, **session_meta, "video": video}, video=video)
