"""One WebRTC call: an aiortc peer connection driving the same realtime consumer as a WebSocket.

The consumer (``webapp.conversations.consumers.RealtimeConsumer``) is run as the ASGI application it
is, with this call standing in for the socket: the ``oai-events`` data channel's messages are its text
frames, the caller's Opus track becomes its binary audio frames, the agent's audio frames go to the
outgoing Opus track, and its close ends the peer connection. So the session model behind a WebRTC call
is the WebSocket's, event for event (persistence, takeover, queueing, recording, revocation through the
channel layer, the console), and there is one protocol translation, not two.

What differs is only what WebRTC itself carries: audio rides the tracks, not events, so the agent's
audio never goes down the data channel and a ``session.update`` cannot change the input format; the
caller's audio is fed only while the session is live (a WebSocket page gates its microphone the same
way); and the caller's playback is acknowledged from what the outgoing track sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from webapp.conversations.consumers import RealtimeConsumer
from webapp.conversations.protocol import AUDIO_FRAME_KIND
from webapp.webrtc.jitter import release_on_arrival
from webapp.webrtc.tracks import AgentAudioTrack, UplinkStats, pump_caller_audio

logger = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"  # the data channel OpenAI's WebRTC clients open
# Events waiting for the data channel to open (a consumer may speak before SCTP is up); beyond this the
# client is not reading and the oldest are dropped.
MAX_WAITING_EVENTS = 512
PLAYBACK_ACK_S = 0.5
# The caller's audio starts with the call, but a client configures the session (persona, voice) with its
# first session.update after session.created, and the persona is fixed once audio began: the track waits for
# that update (the WebSocket page likewise sends it before its first frame), or this long without one.
UPLINK_WAITS_FOR_UPDATE_S = 0.5
CLOSE_FLUSH_S = 1.0  # how long the last events (session.closed) get to leave before the connection closes
_AUDIO_DELTA = '{"type":"response.output_audio.delta"'  # server events are dumped with "type" first
_UPLINK_ON = {"session.created", "session.resumed"}
_UPLINK_OFF = {"session.paused", "session.closed", "session.replaced"}
_FLUSH_DOWNLINK = {"session.paused", "session.closed", "session.replaced"}

live_calls: dict[str, RtcCall] = {}  # this process's calls, by id


def new_call_id() -> str:
    return f"rtc_{secrets.token_hex(12)}"


class RtcCall:
    def __init__(
        self,
        *,
        user: Any,
        api_key_id: int | None,
        query_string: bytes = b"",
        client: tuple[str, int] | None = None,
        initial_session: dict[str, Any] | None = None,
        client_secret: Any = None,
        ice_servers: list | None = None,
    ) -> None:
        self.id = new_call_id()
        self.user = user
        self.api_key_id = api_key_id
        self.query_string = query_string
        self.client = client
        self.initial_session = initial_session
        self.client_secret = client_secret  # a spent secret's grant: the consumer applies and fixes its session
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers or []))
        self.downlink = AgentAudioTrack()
        self.uplink = UplinkStats()
        self.channel = None
        self.waiting: list[str] = []
        self.inbox: asyncio.Queue[dict] = asyncio.Queue()
        self.uplink_open = False
        self.consumer_task: asyncio.Task | None = None
        self.tasks: set[asyncio.Task] = set()
        self.closed = False

    # ---- signalling ------------------------------------------------------------------------------

    async def answer(self, offer_sdp: str) -> str:
        """Take the caller's offer, return our answer (ICE candidates gathered, no trickle)."""
        pc = self.pc
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        audio = [t for t in pc.getTransceivers() if t.kind == "audio"]
        if not audio:
            raise ValueError("The offer has no audio section.")
        release_on_arrival(pc)  # aiortc's own buffer stalls on every lost packet (webrtc/jitter.py)
        audio[0].sender.replaceTrack(self.downlink)
        audio[0].direction = "sendrecv"
        await pc.setLocalDescription(await pc.createAnswer())
        live_calls[self.id] = self
        return pc.localDescription.sdp

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(pump_caller_audio(track, self._caller_audio, self.uplink))

    def _on_datachannel(self, channel) -> None:
        if channel.label != EVENTS_CHANNEL or self.channel is not None:
            return
        self.channel = channel
        channel.on("message", self._on_client_message)
        channel.on("close", lambda: self._spawn(self.close()))
        if channel.readyState == "open":
            self._flush_waiting()
        else:
            channel.on("open", self._flush_waiting)

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and self.consumer_task is None:
            self._start_consumer()
        elif state in ("failed", "closed"):
            await self.close()

    # ---- the consumer, with this call as its socket -------------------------------------------------

    def _start_consumer(self) -> None:
        scope = {
            "type": "websocket",
            "path": "/v1/realtime",
            "query_string": self.query_string,
            "headers": [],
            "subprotocols": [],
            "client": self.client,
            "user": self.user,
            "auth_method": "api_key" if self.api_key_id is not None else "session",
            "api_key_id": self.api_key_id,
            **({"client_secret": self.client_secret, "auth_method": "client_secret"} if self.client_secret else {}),
            "transport": "webrtc",
        }
        self.inbox.put_nowait({"type": "websocket.connect"})
        self.consumer_task = self._spawn(RealtimeConsumer.as_asgi()(scope, self.inbox.get, self._from_consumer))
        self._spawn(self._acknowledge_playback())

    async def _from_consumer(self, message: dict) -> None:
        match message["type"]:
            case "websocket.send" if message.get("bytes") is not None:
                self.downlink.push(message["bytes"][1:])  # an audio frame: kind byte, then pcm16
            case "websocket.send":
                self._server_event(message["text"])
            case "websocket.close":
                self._spawn(self.close(flush=True))

    def _server_event(self, text: str) -> None:
        if text.startswith(_AUDIO_DELTA):  # audio rides the track (binary_audio off: a client turned it off)
            self.downlink.push(base64.b64decode(json.loads(text)["delta"]))
            return
        kind = _event_type(text)
        if kind == "session.created":
            if self.initial_session:
                self._to_consumer_text(json.dumps({"type": "session.update", "session": self.initial_session}))
                self.uplink_open = True
            else:
                self._spawn(self._open_uplink_later())
        elif kind in _UPLINK_ON:
            self.uplink_open = True
        elif kind in _UPLINK_OFF:
            self.uplink_open = False
        if kind in _FLUSH_DOWNLINK:
            self.downlink.flush()
        self._to_client(text)

    def _to_client(self, text: str) -> None:
        channel = self.channel
        if channel is not None and channel.readyState == "open":
            channel.send(text)
        else:
            self.waiting.append(text)
            del self.waiting[:-MAX_WAITING_EVENTS]

    def _flush_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for text in waiting:
            self.channel.send(text)

    def _on_client_message(self, data: str | bytes) -> None:
        if isinstance(data, bytes):
            data = data.decode("utf-8", errors="replace")
        kind = _event_type(data)
        if kind == "output_audio_buffer.clear":  # OpenAI's WebRTC barge-in: drop what waits to be sent
            self.downlink.flush()
            return
        if kind == "response.cancel":
            self.downlink.flush()
        elif kind == "session.update":
            data = _without_input_format(data)
        self._to_consumer_text(data)
        if kind == "session.update" and self.consumer_task is not None:
            self.uplink_open = True  # the audio queued from now on is taken after this update

    def _to_consumer_text(self, text: str) -> None:
        if self.consumer_task is not None and not self.closed:
            self.inbox.put_nowait({"type": "websocket.receive", "text": text})

    async def _open_uplink_later(self) -> None:
        await asyncio.sleep(UPLINK_WAITS_FOR_UPDATE_S)
        self.uplink_open = not self.closed

    async def _caller_audio(self, pcm16: bytes) -> None:
        if self.uplink_open and not self.closed:
            self.inbox.put_nowait({"type": "websocket.receive", "bytes": bytes([AUDIO_FRAME_KIND]) + pcm16})

    async def _acknowledge_playback(self) -> None:
        """What the caller heard, for the recording: the agent audio the track has sent (a WebSocket page
        acknowledges what its player played; here the browser's jitter buffer is the only difference)."""
        acknowledged = -1
        while not self.closed:
            await asyncio.sleep(PLAYBACK_ACK_S)
            sent = self.downlink.stats.sent_ms
            if self.uplink_open and sent != acknowledged:
                acknowledged = sent
                self._to_consumer_text(json.dumps({"type": "playback.ack", "played_ms": sent}))

    # ---- the end ----------------------------------------------------------------------------------

    async def close(self, *, flush: bool = False) -> None:
        """Hang up: the consumer hears a disconnect (a live session is kept for its grace period, as when a
        socket drops), then the peer connection closes."""
        if self.closed:
            return
        self.closed = True
        try:
            await self._hang_up(flush)
        finally:
            # Only now: a call is in the registry until its peer connection has closed, so "no live calls" means
            # nothing of one is still under way (a test that ended mid-close hung its loop's teardown in aiortc).
            live_calls.pop(self.id, None)
        logger.info(
            "webrtc.call_closed",
            extra={
                "call_id": self.id,
                "downlink_underruns": self.downlink.stats.underruns,
                "downlink_late_frames": self.downlink.stats.late_frames,  # sent late, waited for: not a gap
                "uplink_concealed_ms": self.uplink.concealed_ms,
            },
        )

    async def _hang_up(self, flush: bool) -> None:
        self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
        if flush and self.channel is not None:  # let session.closed reach the client first
            with contextlib.suppress(Exception):
                for _ in range(int(CLOSE_FLUSH_S / 0.05)):
                    if self.channel.readyState != "open" or self.channel.bufferedAmount == 0:
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.1)
        if self.consumer_task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self.consumer_task), 5)
        self.downlink.stop()
        await self.pc.close()


def _event_type(text: str) -> str | None:
    """The ``type`` of a JSON event, or None (the consumer reports bad JSON to the client itself)."""
    try:
        event = json.loads(text)
    except ValueError:
        return None
    kind = event.get("type") if isinstance(event, dict) else None
    return kind if isinstance(kind, str) else None


def _without_input_format(text: str) -> str:
    """A ``session.update`` without ``audio.input.format``: over WebRTC the caller's track is the format."""
    try:
        event = json.loads(text)
        event["session"]["audio"]["input"].pop("format", None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return text  # not that shape: the consumer validates it as it is
    return json.dumps(event)
