"""The session's side of its recording: whether it is recorded, when the recording begins, its events.

``SessionRecorder`` is a collaborator of ``DialogueSession`` (its turn modes record their events through it
too). The recording itself is written off the tick's path by ``inference.recording``; this only decides and
forwards.
"""

from __future__ import annotations

from inference.contracts import CloseReason, ParleyError
from inference.recording.chat_steps import ChatRecording
from inference.recording.policy import RecordingPolicy
from inference.recording.recorder import SessionRecording


class SessionRecorder:
    """Whether one session is recorded and, from its first audio or chat message, its recording.

    Args:
        policy: the service's recording policy (it may override the caller's wish).
        requested: the caller's wish to be recorded.
    """

    def __init__(self, policy: RecordingPolicy, requested: bool):
        self.policy = policy
        self.requested = requested
        self.recording: SessionRecording | None = None  # from the first audio (or chat message), when recorded
        self.begun = False  # the first audio or chat message came: whether it is recorded is fixed from then on
        self.video = True  # keep the camera frames the engine sees; the caller may turn it off at any time

    @property
    def recorded(self) -> bool:
        """Recorded (or, before the first audio or chat message, going to be)."""
        if self.begun:
            return self.recording is not None
        return self.policy.records(self.requested)

    def request(self, record: bool | None, *, fixed_since: str) -> None:
        """The caller's new wish (None: keep it). Once begun, one that would change the answer is refused."""
        if record is None:
            return
        if self.begun:
            if self.policy.records(record) != self.recorded:
                raise ParleyError(
                    f"recording is fixed once {fixed_since}", code="record_update_unsupported", param="record"
                )
            return
        self.requested = record

    def request_video(self, record_video: bool | None) -> None:
        """The caller's wish for its camera frames (None: keep it). Honoured from the next frame on, also
        mid-call: turning it off stops keeping frames at once (audio goes on being recorded)."""
        if record_video is None:
            return
        self.video = record_video
        if self.recording is not None:
            self.recording.video = record_video
            self.recording.event("video", on=record_video)

    def begin(self, session_id: str, *, user_key: str, persona: str | None, voice: str | None) -> None:
        """At the first audio (or a chat's first message), when the policy and the caller's wish say so."""
        self.begun = True
        if self.policy.records(self.requested):
            self.recording = self.policy.begin(
                session_id, user_key=user_key, persona=persona, voice=voice, video=self.video
            )

    def chat_steps(self) -> ChatRecording | None:
        """Where a chat's messages and replies go as steps, once begun; None when it is not recorded."""
        return ChatRecording(self.recording, self.policy.meta) if self.recording is not None else None

    def event(self, kind: str, **fields) -> None:
        if self.recording is not None:
            self.recording.event(kind, **fields)

    def finish(self, reason: CloseReason) -> None:
        if self.recording is not None:
            self.recording.finish(reason)
