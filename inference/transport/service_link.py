"""The service's side of a link: one web process's connection, carrying its sessions each on a channel.

A connection per caller cost the service a reader task, an event pump task, a transport and its system calls
per call, all on the interpreter its tick loop needs (bench/notes/serving-e2e.md). A link reads every frame of a
web process in one loop, drains the outboxes of the sessions that have events once a loop iteration, and writes
what a tick made for all of them in one go (``FrameBatch``).

On a channel: the first frame is ``{"id", "op": "open", "request"}``; then calls, answered on the channel, and
events, until ``{"event": "end"}`` (Closed or Replaced came) or the client's unanswered ``detach``. The calls of
a ``LocalHandle`` reach the session at once and never wait, so the link runs them inline, in the order they came.
A frame that cannot be understood is refused on its channel; the link itself ends only when its framing breaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable
from typing import TypeVar

from inference.contracts import ErrorEvent, ParleyError, VoiceRef
from inference.errors import WireError
from inference.service import InferenceService
from inference.session.handle_calls import NO_ARGUMENT_CALLS
from inference.session.local_handle import LocalHandle
from inference.transport import wire
from inference.transport.frame_batch import FrameBatch
from inference.voice_files import checked_voice

logger = logging.getLogger(__name__)

END = wire.json_frame({"event": "end"})
T = TypeVar("T")


def _unreadable(exc: WireError) -> ParleyError:
    """A frame the web tier should never send (it checks what callers send): the web tier's fault, not the caller's."""
    return ParleyError(f"the service could not read a frame: {exc}", code="internal_error", error_type="server_error")


class ServiceLink:
    """One web process's sessions on one connection (after its ``link`` call was answered)."""

    def __init__(self, service: InferenceService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.service, self.reader = service, reader
        self.out = FrameBatch(writer)
        self.handles: dict[int, LocalHandle] = {}
        self._ready: dict[int, None] = {}  # channels whose outbox has events (an ordered set)
        self._resume: asyncio.Task | None = None  # waits out a congested peer, then drains the outboxes

    async def run(self) -> None:
        try:
            while (item := await wire.read_frame(self.reader)) is not None:
                kind, payload = item
                if kind != wire.CHANNEL:
                    raise WireError(f"a link carries channel frames, not kind {kind}")
                await self._on_frame(*wire.split_channel(payload))
                if self.out.congested:
                    await self.out.drain()  # the web process is behind: read no more from it until it catches up
        finally:
            handles, self.handles = self.handles, {}
            for handle in handles.values():
                handle.outbox.on_ready = None
                await handle.detach()  # a lost link: each session waits out its grace for its caller
            if self._resume is not None:
                self._resume.cancel()

    # ---- frames in --------------------------------------------------------------------------------

    async def _on_frame(self, channel: int, kind: int, payload: bytes) -> None:
        handle = self.handles.get(channel)
        if handle is None:
            await self._open_or_refuse(channel, kind, payload)
            return
        try:
            if kind == wire.AUDIO_IN:
                call_id, encoding, rate, data = wire.parse_audio_in(payload)
                if call_id == wire.UNANSWERED:
                    try:
                        await handle.append_audio(data, encoding=encoding, rate=rate)
                    except ParleyError as exc:  # no reply is awaited: the refusal travels as an event
                        self._send(channel, wire.event_frame(ErrorEvent(exc.code, exc.message, exc.error_type)))
                    return
                await self._answer(channel, call_id, handle.append_audio(data, encoding=encoding, rate=rate))
            elif kind == wire.IMAGE_IN:
                call_id, data = wire.parse_id_frame(payload)
                await self._answer(channel, call_id, handle.append_image(data))
            elif kind == wire.JSON:
                call = wire.parse_json(payload)
                call_id, op, args = call.get("id"), call.get("op"), call.get("args") or {}
                if not isinstance(call_id, int) or not isinstance(args, dict):
                    raise WireError("a call needs an integer id and object args")
                if op == "detach":  # the client has let go of the channel: nothing more goes to it
                    self._forget(channel)
                    await handle.detach()
                    return
                await self._answer(channel, call_id, self._dispatch_checked(handle, op, args))
            else:
                raise WireError(f"unexpected frame kind {kind}")
        except WireError as exc:
            self._refuse_frame(channel, exc)

    async def _open_or_refuse(self, channel: int, kind: int, payload: bytes) -> None:
        """A channel's first frame opens its session; a frame for a channel that ended is answered, never served."""
        try:
            call = wire.parse_json(payload) if kind == wire.JSON else {}
            call_id = call.get("id")
            if call.get("op") != "open" or not isinstance(call_id, int):
                if isinstance(call_id, int) and call_id != wire.UNANSWERED:  # a call that raced the channel's end
                    self._reply_error(channel, call_id, ParleyError("the session has ended", code="session_not_ready"))
                return
        except WireError as exc:
            self._refuse_frame(channel, exc)
            return
        handle = await self._answer(channel, call_id, self._open(call.get("request")))
        if handle is None:
            return
        self.handles[channel] = handle
        handle.outbox.on_ready = lambda: self._mark_ready(channel)
        self._mark_ready(channel)  # Ready or Queued is already in its outbox

    async def _open(self, request_fields: object) -> LocalHandle:
        request = wire.request_from_dict(request_fields)
        request = dataclasses.replace(request, voice=self._voice(request.voice))
        return await self.service.open_session(request)

    def _refuse_frame(self, channel: int, exc: WireError) -> None:
        logger.warning("service.bad_frame", extra={"detail": str(exc)})
        error = _unreadable(exc)
        self._send(channel, wire.event_frame(ErrorEvent(error.code, error.message, error.error_type)))

    def _voice(self, voice: VoiceRef | None) -> VoiceRef | None:
        """Only files in the voices storage: a peer never makes the engine read a path of its choosing."""
        return checked_voice(voice, self.service.config.voice_roots)

    def _dispatch(self, handle: LocalHandle, op: object, args: dict):
        if op == "update":
            record, record_video = args.get("record"), args.get("record_video")
            return handle.update(
                persona=args.get("persona"),
                voice=self._voice(wire.voice_from_dict(args.get("voice"))),
                record=record if isinstance(record, bool) else None,
                record_video=record_video if isinstance(record_video, bool) else None,
            )
        if op in NO_ARGUMENT_CALLS:
            return getattr(handle, op)()
        if op == "set_mode":
            mode, seconds = args.get("mode"), args.get("max_response_s")
            return handle.set_mode(
                mode=mode if isinstance(mode, str) else None,  # type: ignore[arg-type] - the session checks it
                turn_detection=wire.turn_detection_from_dict(args.get("turn_detection")),
                max_response_s=seconds if isinstance(seconds, int) and not isinstance(seconds, bool) else None,
            )
        if op == "add_chat_item":
            return handle.add_chat_item(wire.chat_message_from_dict(args.get("message")))
        if op == "playback_ack":
            return handle.playback_ack(args.get("played_ms"), wire.heard_pairs(args.get("heard")))
        if op == "close":
            return handle.close(str(args.get("reason", "client_close")))
        raise ParleyError(f"unknown op {op!r}", code="unknown_event")

    async def _dispatch_checked(self, handle: LocalHandle, op: object, args: dict) -> None:
        await self._dispatch(handle, op, args)  # a refusal while building the call (a voice) becomes its reply

    async def _answer(self, channel: int, call_id: int, call: Awaitable[T]) -> T | None:
        """Run ``call`` and reply on ``channel``; its value, or None when it was refused."""
        try:
            value = await call
        except WireError as exc:  # arguments this service cannot read: the caller's call fails, the link goes on
            self._reply_error(channel, call_id, _unreadable(exc))
            return None
        except ParleyError as exc:
            self._reply_error(channel, call_id, exc)
            return None
        self._send(channel, wire.json_frame({"reply": call_id, "ok": True}))
        return value

    def _reply_error(self, channel: int, call_id: int, exc: ParleyError) -> None:
        self._send(channel, wire.json_frame({"reply": call_id, "error": wire.error_to_dict(exc)}))

    # ---- events out -------------------------------------------------------------------------------

    def _send(self, channel: int, frame: bytes) -> None:
        self.out.write(wire.channel_header(channel, frame), frame)

    def _mark_ready(self, channel: int) -> None:
        if not self._ready:
            asyncio.get_running_loop().call_soon(self._send_events)
        self._ready[channel] = None

    def _send_events(self) -> None:
        """Every ready session's events, in one batch; a congested peer leaves them in the outboxes (which keep the
        newest audio) until it has caught up."""
        if self.out.congested:
            if self._resume is None:
                self._resume = asyncio.create_task(self._after_congestion())
            return
        ready, self._ready = self._ready, {}
        for channel in ready:
            handle = self.handles.get(channel)
            if handle is None:
                continue
            outbox = handle.outbox
            while (event := outbox.take()) is not None:
                self._send(channel, wire.event_frame(event))
            if outbox.finished:  # Closed or Replaced was its last event
                self._send(channel, END)
                self._forget(channel)

    async def _after_congestion(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self.out.drain()
            self._resume = None
            self._send_events()

    def _forget(self, channel: int) -> None:
        handle = self.handles.pop(channel, None)
        if handle is not None:
            handle.outbox.on_ready = None
        self._ready.pop(channel, None)
