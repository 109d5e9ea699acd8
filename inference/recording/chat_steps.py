"""A chat session's recording: its messages as events, its replies (and audio clips) as steps.

A chat session streams no audio, so its recording is made of what was said: each message is a ``message``
event (role, text, whether an image was attached, how long its audio clip was; never the image's bytes),
and each reply piece's audio becomes steps, agent channel = the reply's audio, caller channel = silence of
the same length. A message's audio clip becomes steps too, caller channel = the clip, agent channel =
silence. The reply's text goes in as ``text`` events at the step its audio starts, as a call's does.

The timeline of a chat recording is therefore the concatenation of the recorded audio (clips and replies,
in the order they happened), each padded to whole engine periods so both channels stay aligned; the
minutes someone spent typing between messages are not in it (the events keep their wall-clock ``t``).

Everything here runs on the session's event loop, the only writer of a chat recording (no worker step
feeds it: a chat session opens no streaming slot).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from inference.audio import pcm
from inference.audio.resample import resample_clip
from inference.contracts import ChatMessage
from inference.engines.base import SlotOutput
from inference.recording.recorder import SessionRecording, record_steps
from inference.recording.wall_clock import CHAT_EVENT

_NO_OUTPUT = SlotOutput(audio=np.zeros(0, np.float32))  # a step's text goes in as its own event


class ChatRecording:
    """Feeds one chat session's ``SessionRecording``; ``meta`` is the service's recording meta (rates, period)."""

    def __init__(self, recording: SessionRecording, meta: dict[str, Any]):
        self.recording = recording
        recording.event(CHAT_EVENT)  # the reader lays this recording's audio end to end, not on the wall clock
        self.input_rate = int(meta["input_rate"])
        self.caller_step = int(meta["input_chunk_samples"])
        self.agent_step = round(int(meta["output_rate"]) * int(meta["chunk_period_ms"]) / 1000)

    def message(self, message: ChatMessage) -> None:
        """A message was added: its text and what was attached; an audio clip's samples on the caller channel."""
        fields: dict[str, Any] = {"role": message.role, "text": message.text, "image": message.image is not None}
        clip = None
        if message.audio is not None:
            clip = pcm.decode(message.audio, "pcm16")
            fields["audio_s"] = round(clip.size / message.audio_rate, 3)
            if message.audio_rate != self.input_rate:
                clip = resample_clip(clip, message.audio_rate, self.input_rate)
        self.recording.event("message", **fields)
        if clip is not None and clip.size:
            self._steps(clip, np.zeros(0, np.int16))

    def reply_text(self, text: str) -> None:
        """A reply's text, at the step its audio (recorded next) starts."""
        if text:
            self.recording.event("text", text=text)

    def reply_audio(self, pcm16: bytes) -> None:
        """A reply piece's audio on the agent channel, silence of the same length on the caller's."""
        agent = np.frombuffer(pcm16[: len(pcm16) // 2 * 2], dtype="<i2")
        if agent.size:
            self._steps(np.zeros(0, np.float32), agent)

    def _steps(self, caller: np.ndarray, agent: np.ndarray) -> None:
        """Whole periods of both channels, the shorter (or absent) one padded with silence."""
        count = max(math.ceil(caller.size / self.caller_step), math.ceil(agent.size / self.agent_step))
        caller_all = np.zeros(count * self.caller_step, np.float32)
        caller_all[: caller.size] = caller
        agent_all = np.zeros(count * self.agent_step, "<i2")
        agent_all[: agent.size] = agent
        items = [
            self.recording.step_item(
                caller_all[k * self.caller_step : (k + 1) * self.caller_step],
                agent_all[k * self.agent_step : (k + 1) * self.agent_step].tobytes(),
                _NO_OUTPUT,
                0.0,
            )
            for k in range(count)
        ]
        record_steps(items)
