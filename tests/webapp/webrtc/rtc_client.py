"""A WebRTC caller made of aiortc: a tone or a file as its microphone, what it hears and every event kept.

Used by the WebRTC endpoint tests and by bench/impairment.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from webapp.webrtc.jitter import release_on_arrival
from webapp.webrtc.tracks import OPUS_RATE, WholeFrameResampler, pcm16_frame

RATE = 24_000
FRAME_SAMPLES = 480  # 20 ms


class ArrayMicrophone(MediaStreamTrack):
    """Sends ``signal`` (float32 at 24 kHz, looped) in real time, 20 ms a frame at 48 kHz as a browser's
    microphone does (at 24 kHz, aiortc's encoder would send each frame 20 ms late: webapp/webrtc/tracks.py);
    ``sent_at`` keeps each frame's send time by its first sample's index, for mouth-to-ear."""

    kind = "audio"

    def __init__(self, signal: np.ndarray) -> None:
        super().__init__()
        self.pcm = (np.clip(signal, -1, 1) * 32767).astype("<i2")
        self.position = 0
        self.start: float | None = None
        self.frames = 0
        self.sent_at: list[float] = []  # when each frame left (time.monotonic())
        self.upsampler = WholeFrameResampler(OPUS_RATE)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.start is None:
            self.start = time.monotonic()
        due = self.start + self.frames * FRAME_SAMPLES / RATE
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        index = np.arange(self.position, self.position + FRAME_SAMPLES) % len(self.pcm)
        pcm = self.upsampler.resample(pcm16_frame(self.pcm[index].tobytes(), RATE, self.frames * FRAME_SAMPLES))
        frame = pcm16_frame(pcm, OPUS_RATE, self.frames * FRAME_SAMPLES * (OPUS_RATE // RATE))
        self.position = (self.position + FRAME_SAMPLES) % len(self.pcm)
        self.frames += 1
        self.sent_at.append(time.monotonic())
        return frame


@dataclass
class RtcCaller:
    pc: RTCPeerConnection
    channel: Any
    events: list[dict] = field(default_factory=list)
    heard: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (arrival, 24 kHz mono float32)
    heard_pts: list[float] = field(default_factory=list)  # each piece's media time (s), from its RTP timestamp
    waiters: list[tuple[str, asyncio.Future]] = field(default_factory=list)

    def send(self, event: dict) -> None:
        self.channel.send(json.dumps(event))

    async def until(self, event_type: str, wait_s: float = 10.0) -> dict:
        for event in self.events:
            if event["type"] == event_type:
                return event
        future = asyncio.get_running_loop().create_future()
        self.waiters.append((event_type, future))
        return await asyncio.wait_for(future, wait_s)

    def count(self, event_type: str) -> int:
        return sum(1 for event in self.events if event["type"] == event_type)

    def heard_audio(self) -> np.ndarray:
        return np.concatenate([piece for _, piece in self.heard]) if self.heard else np.zeros(0, np.float32)

    def _on_event(self, text: str) -> None:
        event = json.loads(text)
        self.events.append(event)
        for waiter in list(self.waiters):
            if waiter[0] == event["type"] and not waiter[1].done():
                waiter[1].set_result(event)
                self.waiters.remove(waiter)

    async def close(self) -> None:
        await self.pc.close()


async def _listen(track: MediaStreamTrack, caller: RtcCaller) -> None:
    resampler = WholeFrameResampler(RATE)  # each packet's 20 ms stays one piece, as a browser plays it
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        media_s = float(frame.pts * frame.time_base) if frame.pts is not None else None
        pcm = np.frombuffer(resampler.resample(frame), "<i2").astype(np.float32) / 32767
        caller.heard.append((time.monotonic(), pcm))
        caller.heard_pts.append(media_s)


async def rtc_offer(microphone: MediaStreamTrack, ice_servers=None) -> tuple[RtcCaller, str]:
    """A peer connection with the microphone, a receive side and the ``oai-events`` channel; its offer SDP.

    Its receiver releases packets as they arrive, as the server's does (webapp/webrtc/jitter.py)."""
    from aiortc import RTCConfiguration

    pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers or []))
    pc.addTransceiver(microphone, direction="sendrecv")
    release_on_arrival(pc)
    caller = RtcCaller(pc=pc, channel=pc.createDataChannel("oai-events"))
    caller.channel.on("message", caller._on_event)
    pc.on("track", lambda track: asyncio.ensure_future(_listen(track, caller)))
    await pc.setLocalDescription(await pc.createOffer())
    return caller, pc.localDescription.sdp


async def rtc_answer(caller: RtcCaller, answer_sdp: str) -> None:
    await caller.pc.setRemoteDescription(RTCSessionDescription(sdp=answer_sdp, type="answer"))
