"""The session's side of its recording: whether it is recorded, when the recording begins, its events.

``DialogueSession`` mixes this in (kept out of dialogue.py). The recording itself is written off the tick's
path by ``inference.recording``; this only decides and forwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.session.dialogue import DialogueSession


class SessionRecordingMixin:
    """Recording decisions for ``DialogueSession``."""

    @property
    def recorded(self: DialogueSession) -> bool:
        """Recorded (or, before the first audio or chat message, going to be)."""
        if self.audio_started or self.chat_started:
            return self.recording is not None
        return self._recording_policy.records(self.record_requested)

    def _record(self: DialogueSession, kind: str, **fields) -> None:
        if self.recording is not None:
            self.recording.event(kind, **fields)

    def _begin_recording(self: DialogueSession) -> None:
        """At the first audio (or a chat's first message), when the policy and the caller's wish say so."""
        if self._recording_policy.records(self.record_requested):
            self.recording = self._recording_policy.begin(
                self.session_id,
                user_key=self.user_key,
                persona=self.persona,
                voice=self.voice.voice_id if self.voice is not None else None,
            )
