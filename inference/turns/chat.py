"""Chat mode: typed messages (with an optional image or audio clip), each answered by the engine.

The session keeps the conversation. A response takes an engine slot from the pool (or queues for one) at
``create_response`` and gives it back when the reply ends, so a chat session holds no slot while the person
types. The reply is generated on the worker's thread (``inference.slots.chats``) from the whole
conversation, and streamed back as the same events a half-duplex response sends: ``ResponseStarted``, then
``TextOut`` / ``AudioOut`` of its epoch, then ``ResponseEnded``.

The controller lives on the session's event loop and talks to its session only through ``ChatHost``.
"""

from __future__ import annotations

import asyncio
import io
import time
from typing import Protocol

from inference import image_header
from inference.audio import pcm
from inference.contracts import (
    MAX_CHAT_AUDIO_S,
    MAX_CHAT_ITEM_BYTES,
    MAX_CHAT_TEXT_CHARS,
    AudioOut,
    ChatMessage,
    ErrorEvent,
    ParleyError,
    Queued,
    ResponseEnded,
    ResponseStarted,
    SessionEvent,
    TextOut,
    VoiceRef,
)
from inference.engines.base import ChatRequest, SlotOutput

TOKENS_PER_S = 10  # the reply's cap: max_response_s seconds of speech, about ten text ids a second
DEFAULT_MAX_RESPONSE_S = 30
MAX_RESPONSE_S_LIMIT = 600


class ChatHost(Protocol):
    """The session, as the chat controller drives it."""

    session_id: str
    user_key: str
    persona: str | None
    voice: VoiceRef | None

    def emit(self, event: SessionEvent) -> None: ...
    def next_epoch(self) -> int: ...


class SlotRequests(Protocol):
    """The slot pool (``SlotPool``), as a response asks it for a slot and gives it back."""

    def request(self, applicant: _Response) -> None: ...
    def release(self, applicant: _Response, slot: int | None, held_s: float = 0.0) -> None: ...


class ChatWorker(Protocol):
    def chat(self, slot: int, request: ChatRequest, listener: _Response, loop: asyncio.AbstractEventLoop) -> None: ...


def check_message(message: ChatMessage) -> None:
    """Refuse what no engine should be asked: too large, an image that is not an image, a bad audio clip."""
    if len(message.text) > MAX_CHAT_TEXT_CHARS or message.nbytes > MAX_CHAT_ITEM_BYTES:
        raise ParleyError(
            f"a chat message may hold at most {MAX_CHAT_TEXT_CHARS} characters of text and "
            f"{MAX_CHAT_ITEM_BYTES} bytes in all (text, image and audio)",
            code="message_too_large",
            param="item.content",
        )
    if message.image is not None:
        check_image(message.image)
    if message.audio is not None:
        pcm.check_format("pcm16", message.audio_rate)
        samples = pcm.decode(message.audio, "pcm16")
        if not 0.1 * message.audio_rate <= samples.size <= MAX_CHAT_AUDIO_S * message.audio_rate:
            raise ParleyError(
                f"an audio part must last between 0.1 and {MAX_CHAT_AUDIO_S:g} s", code="invalid_audio", param="audio"
            )
    if not message.text and message.image is None and message.audio is None:
        raise ParleyError("a message needs text, an image or audio", code="invalid_value", param="item.content")


def check_image(data: bytes) -> None:
    """``invalid_image`` unless ``data`` is a whole JPEG or PNG of a size the engine decodes."""
    from PIL import Image

    if reason := image_header.refusal(data):
        raise ParleyError(reason, code="invalid_image", param="image_url")
    try:
        with Image.open(io.BytesIO(data), formats=("PNG", "JPEG")) as img:
            img.verify()  # the whole file, without keeping the bitmap
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds for a broken file
        raise ParleyError(f"the image cannot be decoded ({exc})", code="invalid_image", param="image_url") from None


class _Response:
    """One response: the pool's applicant for a slot, then the worker's listener for the reply's pieces."""

    snapshot_state = "live"  # what the occupancy view shows for the slot it holds

    def __init__(self, chat: Chat, epoch: int):
        self.chat, self.epoch = chat, epoch
        self.session_id, self.user_key = chat.host.session_id, chat.host.user_key
        self.slot: int | None = None
        self.admitted_at: float | None = None
        self.text: list[str] = []

    # ---- the pool -------------------------------------------------------------------------------------------

    def admitted(self, slot: int) -> None:
        self.chat._admitted(self, slot)

    def queue_position(self, position: int, queue_length: int, estimated_wait_s: float) -> None:
        if self.chat.response is self:
            self.chat.host.emit(Queued(position, queue_length, estimated_wait_s))

    # ---- the worker -----------------------------------------------------------------------------------------

    def chat_output(self, output: SlotOutput, pcm16: bytes) -> None:
        self.chat._output(self, output, pcm16)

    def chat_failed(self, message: str) -> None:
        self.chat._failed(self, message)


class Chat:
    """The conversation of one chat session and its response, if one runs.

    Args:
        host: the session.
        pool: the slot pool a response takes its slot from.
        worker: the engine worker that generates replies.
        loop: the session's event loop.
    """

    def __init__(self, host: ChatHost, pool: SlotRequests, worker: ChatWorker, loop: asyncio.AbstractEventLoop):
        self.host, self._pool, self._worker, self._loop = host, pool, worker, loop
        self.history: list[ChatMessage] = []
        self.response: _Response | None = None
        self.max_response_s = DEFAULT_MAX_RESPONSE_S

    def add(self, message: ChatMessage) -> None:
        check_message(message)
        self.history.append(message)

    def create_response(self) -> None:
        if self.response is not None:
            raise ParleyError(
                "a response is already in progress; cancel it or wait for response.done",
                code="conversation_already_has_active_response",
            )
        if not self.history:
            raise ParleyError(
                "nothing to answer: add a message with conversation.item.create first", code="conversation_empty"
            )
        response = _Response(self, self.host.next_epoch())
        self.response = response
        self.host.emit(ResponseStarted(response.epoch))  # before a Queued the request may send
        try:
            self._pool.request(response)  # a free slot: admitted at once; else queued (or resource_exhausted)
        except ParleyError:
            self.response = None
            self.host.emit(ResponseEnded(response.epoch, "failed"))
            raise

    def cancelled(self) -> None:
        """``response.cancel``: the session already moved to a new epoch."""
        if self.response is not None:
            self._finish(self.response, "cancelled")

    def close(self) -> None:
        response, self.response = self.response, None
        if response is not None:
            self._pool.release(response, response.slot)

    # ---- callbacks ----------------------------------------------------------------------------------------

    def _admitted(self, response: _Response, slot: int) -> None:
        response.slot, response.admitted_at = slot, time.monotonic()
        if self.response is not response:  # cancelled while it waited: give the slot straight back
            self._pool.release(response, slot)
            return
        request = ChatRequest(
            messages=tuple(self.history),
            persona=self.host.persona,
            voice=self.host.voice,
            max_tokens=self.max_response_s * TOKENS_PER_S,
        )
        self._worker.chat(slot, request, response, self._loop)

    def _output(self, response: _Response, output: SlotOutput, pcm16: bytes) -> None:
        if self.response is not response:
            return  # a cancelled reply's late piece
        if output.text:
            response.text.append(output.text)
            self.host.emit(TextOut(output.text, response.epoch))
        if pcm16:
            self.host.emit(AudioOut(pcm16, response.epoch))
        if output.end_of_turn:  # at the length cap: incomplete, as OpenAI says of max_output_tokens
            self._finish(response, "incomplete" if output.cut_off else "completed")

    def _failed(self, response: _Response, message: str) -> None:
        if self.response is response:
            self.host.emit(ErrorEvent("response_failed", message, error_type="server_error"))
            self._finish(response, "failed")

    def _finish(self, response: _Response, status: str) -> None:
        self.response = None
        text = "".join(response.text)
        if text:
            self.history.append(ChatMessage("assistant", text))
        self._pool.release(response, response.slot)  # no held time: a reply is not a call, for the wait estimate
        self.host.emit(ResponseEnded(response.epoch, status))  # type: ignore[arg-type]
