"""``/v1/realtime``: moves events between one WebSocket and the user's inference session.

Transport only. Parsing lives in ``protocol``, why a socket is refused at connect in ``connect_refusals``,
server-event bookkeeping in ``server_events``, what a session event says on the wire in ``session_event_wire``,
ORM work and fault handling in ``services`` (touched at session edges, on ``session.update`` and by the account
check, never per frame), and the session itself behind ``inference.api``. Errors arrive typed (``ProtocolError``, the facade's and the services' ``ParleyError``); every
one becomes one ``error`` event through ``_reject``, the single place where they are translated, and the session
goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from inference import api
from inference.contracts import (
    Closed,
    ErrorEvent,
    ParleyError,
    Ready,
    Replaced,
    SessionEvent,
    SessionRequest,
)
from webapp.accounts import revocation
from webapp.conversations import chat_items, secret_scope, services
from webapp.conversations import protocol as p
from webapp.conversations.account_watch import watch_account
from webapp.conversations.close_codes import CLOSE_CODE_BY_REASON, CONNECT_CLOSE_CODES, CloseCode
from webapp.conversations.connect_query import requested_mode, requested_model
from webapp.conversations.connect_refusals import refusal_at_connect
from webapp.conversations.dispatch_loop import dispatch_until_stopped
from webapp.conversations.event_sending import ServerEventSending
from webapp.conversations.inbound_lane import InboundLane
from webapp.conversations.outbound_lane import DIRECT_EVENTS, OutboundLane
from webapp.conversations.server_events import Outgoing, RealtimeEvents, SessionView, new_id
from webapp.conversations.session_event_wire import SessionEventWire
from webapp.conversations.session_update import apply_session_config
from webapp.conversations.socket_lane import SocketLane
from webapp.operations.metrics import MESSAGES_RECEIVED, OUTPUT_EVENTS
from webapp.recordings import services as recordings

logger = logging.getLogger(__name__)


async def _nothing() -> None:
    """The recording row is written once, after session.created, with everything the secret chose."""


class RealtimeConsumer(ServerEventSending, AsyncWebsocketConsumer):
    handle: api.SessionHandle | None = None
    account_watch: asyncio.Task | None = None  # see account_watch.watch_account
    lane: SocketLane | None = None  # set once the socket is accepted, when the server is daphne
    inbound: InboundLane | None = None  # the binary frames' way in past the frameworks, with the lane
    outbound: OutboundLane | None = None  # a live call's audio and text out past the pump, with the lane
    dispatching = False  # a client message is in dispatch: the inbound lane leaves frames to the queue

    async def __call__(self, scope, receive, send) -> None:
        # channels' own __call__, with its per-message task and wait replaced (see dispatch_loop).
        self.scope = scope
        self.base_send = send
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        layer_receive = None
        if self.channel_layer is not None:
            self.channel_name = await self.channel_layer.new_channel()
            layer_receive = functools.partial(self.channel_layer.receive, self.channel_name)
        with contextlib.suppress(StopConsumer):
            await dispatch_until_stopped(receive, layer_receive, self.dispatch)

    async def connect(self) -> None:
        self.handle = None
        self.finished = False  # the session ended or moved to another socket: never detach it
        self.socket_closed = False
        self.ready = False
        self.pump: asyncio.Task | None = None
        self.pump_waiting = False  # the pump is parked awaiting the next session event (outbound_lane)
        self.send_lock = asyncio.Lock()
        self.sending = 0  # _emit calls under way or waiting for the lock (outbound_lane)
        self.grant = self.scope.get("client_secret")  # client_secrets.Grant: this socket spent a client secret
        model = self.grant.model if self.grant and self.grant.model else requested_model(self.scope)
        self.view = SessionView(model=model, input_rates=tuple(settings.PARLEY_INPUT_RATES))
        self.events = RealtimeEvents(self.view)
        self.wire = SessionEventWire(self.events)  # what each session event says to the client
        self.user = self.scope.get("user")
        self.revocation_groups: list[str] = []
        await self.accept(subprotocol=secret_scope.selected_subprotocol(self.scope))
        self.lane = SocketLane.for_scope(self.scope)  # what this socket sends, past the frameworks' send path
        if self.lane is not None:
            self.inbound = InboundLane.install(self.lane.protocol, self._take_audio_now)
        if refused := refusal_at_connect(self.scope):
            error, close_code = refused
            await self._reject(error)
            await self._close(close_code)
            return
        granted_mode = self.grant.session.duplex.mode if self.grant and self.grant.session.duplex else None
        mode = granted_mode or requested_mode(self.scope)
        request = SessionRequest(
            user_key=str(self.user.pk), model=self.view.model, mode=mode if mode == "chat" else None
        )
        try:
            self.handle = await api.open_session(request)
        except ParleyError as exc:
            await self._reject(exc)
            await self._close(CONNECT_CLOSE_CODES.get(exc.code, CloseCode.POLICY))
            return
        await self._join_revocation_groups()
        self.pump = asyncio.create_task(self._pump_session_events())
        if self.lane is not None:
            self.outbound = OutboundLane(self.handle, self.lane, self.wire.render, self._may_send_now, self._emit)

    async def _join_revocation_groups(self) -> None:
        """Hear about this socket's credentials being revoked (see webapp.accounts.revocation)."""
        if self.channel_layer is None:
            return
        self.revocation_groups = [revocation.user_group(self.user.pk)]
        if (api_key_id := self.scope.get("api_key_id")) is not None:
            self.revocation_groups.append(revocation.api_key_group(api_key_id))
        for group in self.revocation_groups:
            await self.channel_layer.group_add(group, self.channel_name)

    async def credentials_revoked(self, message: dict) -> None:
        """The key or the account of this socket was revoked: end the session now (session.closed follows)."""
        logger.info("realtime.credentials_revoked", extra={"session_id": self.view.session_id, "why": message["why"]})
        if self.handle is not None and not self.finished:
            await self.handle.close("credentials_revoked")

    async def disconnect(self, code: int) -> None:
        self.socket_closed = True
        if self.inbound is not None:
            self.inbound.remove()
            self.inbound = None  # it holds this consumer's method
        self._remove_outbound()
        if self.account_watch is not None:
            self.account_watch.cancel()
        for group in self.revocation_groups:
            await self.channel_layer.group_discard(group, self.channel_name)
        if self.pump is not None and self.pump is not asyncio.current_task():
            self.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.pump
        if self.handle is not None and not self.finished:
            self.finished = True
            await self.handle.detach()  # keep the session paused for the grace period
            if self.view.session_id:
                await database_sync_to_async(services.conversation_detach)(session_id=self.view.session_id)
        # A task that ended keeps its frame (a cancelled one through its exception's traceback) and the frame keeps
        # this consumer: let go of them, so that a call's objects go when daphne lets go of the connection rather
        # than at the interpreter's next full collection.
        self.account_watch = self.pump = None

    # ---- client -> session ------------------------------------------------------------------

    async def dispatch(self, message) -> None:
        # Channels closes stale database connections before every message, a thread hop each: at 12.5 or more
        # frames a second per caller that was half of the inbound dispatch (bench/notes/serving-e2e.md). This
        # consumer reaches the database only through database_sync_to_async, which closes them in its own
        # thread, so a received frame goes straight to its handler.
        self.dispatching = True
        try:
            if message["type"] == "websocket.receive":
                await self.websocket_receive(message)
            else:
                await super().dispatch(message)
        finally:
            self.dispatching = False

    def _take_audio_now(self, frame: bytes) -> bool:
        """A binary frame from the inbound lane: True once its audio is in the session, False to send it the
        ordinary way (``receive``), which refuses and answers whatever this declines, exactly as before."""
        handle = self.handle
        if self.dispatching or not self.ready or self.finished or handle is None or len(frame) < 2:
            return False
        encoding, rate = p.INPUT_FORMATS[self.view.input_type], self.view.input_rate
        try:
            p.check_size(frame, settings.PARLEY_MAX_EVENT_BYTES)
            taken = handle.append_audio_now(p.split_binary_frame(frame), encoding=encoding, rate=rate)
        except Exception:  # noqa: BLE001 - refused before anything was appended: the ordinary path raises it again
            return False
        MESSAGES_RECEIVED["lane"] += taken
        return taken

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        MESSAGES_RECEIVED["framework"] += 1
        if self.handle is None or self.finished:
            return
        event_id = None
        try:
            async with services.unexpected_faults("realtime.receive_failed", session_id=self.view.session_id):
                p.check_size(text_data if text_data is not None else bytes_data or b"", settings.PARLEY_MAX_EVENT_BYTES)
                if text_data is None:
                    self._require_ready()
                    # A binary frame has no event id to echo: its refusals may come as error events.
                    await self._append_audio(p.split_binary_frame(bytes_data or b""), answered=False)
                    return
                event = p.parse_client_event(text_data)
                event_id = event.event_id
                if not isinstance(event, p.SessionClose):
                    self._require_ready()
                await self._dispatch(event)
        except services.AccountInactive:
            await self._end_for_inactive_account()
        except (p.ProtocolError, ParleyError) as exc:
            await self._reject(exc, event_id)

    def _require_ready(self) -> None:
        if not self.ready:
            raise p.ProtocolError("session_not_ready", "Wait for session.created before sending this event.")

    async def _dispatch(self, event: Any) -> None:
        handle = self.handle
        assert handle is not None
        match event:
            case p.SessionUpdate():
                await self._session_update(event)
            case p.InputAudioBufferAppend():
                await self._append_audio(
                    p.decode_base64(event.audio, code="invalid_audio", param="audio", event_id=event.event_id)
                )
            case p.InputAudioBufferCommit() if self.view.mode == "half_duplex":
                await handle.commit_input()  # input_audio_buffer.committed comes back as a session event
            case p.InputAudioBufferClear() if self.view.mode == "half_duplex":
                await handle.clear_input()
                await self._emit([self.events.event("input_audio_buffer.cleared")])
            case p.ResponseCreate() if self.view.mode in ("half_duplex", "chat"):
                await handle.create_response()
            case p.ConversationItemCreate():
                await self._chat_item(event)
            case p.InputAudioBufferCommit():  # a duplex model listens continuously: nothing to commit
                await self._emit(
                    [self.events.event("input_audio_buffer.committed", previous_item_id=None, item_id=new_id("item"))]
                )
            case p.InputAudioBufferClear():
                await self._emit([self.events.event("input_audio_buffer.cleared")])
            case p.InputImageAppend():
                await self._append_image(event)
            case p.ResponseCreate():
                pass  # the long-lived response already runs; accepted for stock clients
            case p.ResponseCancel():
                await handle.cancel()
                await self._emit(self.events.cancel())
            case p.ResponseForceListen():
                await handle.force_listen()
            case p.SessionPause():
                await handle.pause()
            case p.SessionResume():
                await handle.resume()
            case p.PlaybackAck():
                await handle.playback_ack(event.played_ms, event.heard)
            case p.SessionClose():
                await handle.close("client_close")

    async def _append_audio(self, data: bytes, *, answered: bool = True) -> None:
        if not data:
            return
        assert self.handle is not None
        encoding, rate = p.INPUT_FORMATS[self.view.input_type], self.view.input_rate
        await self.handle.append_audio(data, encoding=encoding, rate=rate, answered=answered)

    async def _append_image(self, event: p.InputImageAppend) -> None:
        assert self.handle is not None
        caps = self.view.capabilities
        if caps is not None and not caps.video:  # say so before decoding a large payload for nothing
            raise p.ProtocolError("unsupported_input", f"The {caps.engine} engine takes no images.", param="image")
        image = p.decode_base64(event.image, code="invalid_image", param="image", event_id=event.event_id)
        await self.handle.append_image(image)  # the facade checks for JPEG/PNG

    async def _chat_item(self, event: p.ConversationItemCreate) -> None:
        if self.view.mode != "chat":
            raise p.ProtocolError(
                "unsupported_mode", "Conversation items are taken in chat mode only.", param="session.duplex.mode"
            )
        message, item = chat_items.chat_message(event, self.view)
        await self.handle.add_chat_item(message)  # type: ignore[union-attr] - set while events arrive
        await self._emit(self.events.add_message_item(item))

    async def _session_update(self, event: p.SessionUpdate) -> None:
        """Validate everything first, then apply: a rejected update changes nothing (``session_update``)."""
        assert self.handle is not None
        if self.grant is not None:  # a secret's session: the fields it fixed stay as they are
            secret_scope.check_update(self.grant.session, event.session, current_instructions=self.view.instructions)
        await apply_session_config(
            event.session, handle=self.handle, view=self.view, user_id=self.user.pk, sync_recording=self._sync_recording
        )
        await self._emit([self.events.event("session.updated", session=self.events.session_object())])

    # ---- session -> client ------------------------------------------------------------------

    async def _pump_session_events(self) -> None:
        assert self.handle is not None
        events = aiter(self.handle.events())
        try:
            async with services.unexpected_faults("realtime.pump_failed", session_id=lambda: self.view.session_id):
                while True:
                    self.pump_waiting = True  # exactly while parked: it holds no event it has not sent yet
                    try:
                        event = await anext(events)
                    except StopAsyncIteration:
                        break
                    finally:
                        self.pump_waiting = False
                    OUTPUT_EVENTS["queue"] += isinstance(event, DIRECT_EVENTS)
                    await self._on_session_event(event)
                    if self.finished:
                        return
            # The stream ended without Closed/Replaced: the session is gone; say so rather than hang.
            self.finished = True
            await self._reject(p.ProtocolError("internal_error", "The session ended.", error_type="server_error"))
            await self._close(CloseCode.SERVER_ERROR)
        except services.ServiceFault as exc:  # a fault here ends this socket, not the server
            await self._reject(exc)
            await self._close(CloseCode.SERVER_ERROR)
        except ParleyError as exc:
            await self._reject(exc)
        finally:
            self._remove_outbound()

    def _may_send_now(self) -> bool:
        """The outbound lane's condition on this socket: nothing of it is pending (outbound_lane's note, Order)."""
        return self.pump_waiting and not self.sending and not self.socket_closed and not self.finished

    def _remove_outbound(self) -> None:
        if self.outbound is not None:
            self.outbound.remove()
            self.outbound = None  # it holds this consumer's methods

    async def _on_session_event(self, event: SessionEvent) -> None:
        if (outgoing := self.wire.render(event)) is not None:
            await self._emit(outgoing)
            return
        match event:
            case Ready():
                await self._on_ready(event)
            case ErrorEvent():
                await self._reject(ParleyError(event.message, code=event.code, error_type=event.error_type))
            case Replaced():
                self.finished = True
                await self._emit([*self.events.end_response("cancelled"), self.events.event("session.replaced")])
                await self._close(CloseCode.REPLACED)
            case Closed():
                await self._on_closed(event)

    async def _on_ready(self, event: Ready) -> None:
        view = self.view
        view.session_id, view.capabilities, view.resumed = event.session_id, event.capabilities, event.resumed
        view.instructions = event.persona if event.persona is not None else view.instructions
        view.voice = event.voice if event.voice is not None else view.voice
        view.record = event.recorded
        view.mode = event.mode
        view.turn_detection = {"type": "server_vad", **event.turn_detection} if event.turn_detection else None
        self.ready = True
        if self.grant is not None:  # the secret's configuration, before the client sees the session
            try:
                await apply_session_config(
                    self.grant.session, handle=self.handle, view=view, user_id=self.user.pk, sync_recording=_nothing
                )
            except (p.ProtocolError, ParleyError) as exc:  # e.g. its persona was deleted since: not this session
                await self._reject(exc)
                await self.handle.close("client_close")  # the error above says why
                return
        if self.account_watch is None and not self.socket_closed:
            self.account_watch = asyncio.create_task(
                watch_account(
                    user_id=self.user.pk, ended=lambda: self.finished, on_inactive=self._end_for_inactive_account
                )
            )
        await self._emit([self.events.session_created()])
        logger.info(
            "realtime.session_ready",
            extra={"session_id": event.session_id, "user_id": self.user.pk, "resumed": event.resumed},
        )
        await database_sync_to_async(services.conversation_open)(
            user=self.user, session_id=event.session_id, engine=event.capabilities.engine
        )
        await self._sync_recording()

    async def _end_for_inactive_account(self) -> None:
        """Like a revocation: the session closes with ``credentials_revoked`` (session.closed, then 4401)."""
        await self.credentials_revoked({"why": "user_inactive"})

    async def _sync_recording(self) -> None:
        """The recording's catalogue row follows whether the session is recorded (session edges only)."""
        view = self.view
        await database_sync_to_async(recordings.recording_sync)(
            user=self.user,
            session_id=view.session_id,
            recorded=view.record,
            engine=view.capabilities.engine if view.capabilities else "",
            persona_id=view.persona_id,
            persona_version=view.persona_version,
            voice=view.voice,
            mode=view.mode,
        )

    async def _on_closed(self, event: Closed) -> None:
        self.finished = True
        logger.info("realtime.session_closed", extra={"session_id": self.view.session_id, "reason": event.reason})
        failed = event.reason == "engine_failed"
        outgoing: list[Outgoing] = self.events.end_response("failed" if failed else "completed")
        if failed:
            outgoing.append(
                self.events.error("engine_failed", "The engine failed; the session ended.", error_type="server_error")
            )
        outgoing.append(self.events.event("session.closed", reason=event.reason))
        await self._emit(outgoing)
        if self.view.session_id:
            await database_sync_to_async(services.conversation_close)(
                session_id=self.view.session_id, reason=event.reason
            )
            recordings.session_closed(
                session_id=self.view.session_id, reason=event.reason, nothing_recorded=event.nothing_recorded
            )
        await self._close(CLOSE_CODE_BY_REASON.get(event.reason, CloseCode.NORMAL))
