"""Chat replies on the engine worker's thread: one reply iterator per slot, advanced piece by piece.

A chat response holds its slot only while it runs (``inference.turns.chat``). The worker starts its reply
with ``engine.chat`` and advances it after each tick's step, within a share of the tick, so duplex calls on
the other slots keep their clock; each piece goes to the session's loop at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from inference.audio.pcm import encode_pcm16_many
from inference.engines.base import ChatRequest, Engine, SlotOutput

logger = logging.getLogger(__name__)


class ChatListener(Protocol):
    """The asyncio-side owner of a chat reply; called on its own event loop."""

    def chat_output(self, output: SlotOutput, pcm16: bytes) -> None: ...
    def chat_failed(self, message: str) -> None: ...


@dataclass
class _Reply:
    pieces: Iterator[SlotOutput]
    listener: ChatListener
    loop: asyncio.AbstractEventLoop


class ChatJobs:
    """The replies being generated, by slot. Only the worker thread touches it."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.replies: dict[int, _Reply] = {}

    def start(self, slot: int, request: ChatRequest, listener: ChatListener, loop: asyncio.AbstractEventLoop) -> None:
        self.stop(slot)
        reply = _Reply(iter(()), listener, loop)
        try:
            reply.pieces = iter(self.engine.chat(slot, request))
        except Exception as exc:  # noqa: BLE001 - the session hears of it; the worker goes on
            logger.exception("engine.chat(%d) failed", slot)
            _post(reply, "chat_failed", f"chat failed: {type(exc).__name__}: {exc}")
            return
        self.replies[slot] = reply

    def stop(self, slot: int) -> None:
        """Drop the slot's reply (cancelled, or the slot is closing); its generator frees what it took."""
        reply = self.replies.pop(slot, None)
        if reply is not None and hasattr(reply.pieces, "close"):
            try:
                reply.pieces.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                logger.exception("chat reply of slot %d failed to close", slot)

    def advance(self, until: float) -> None:
        """One piece of every reply in turn, again while time is left before ``until`` (perf_counter)."""
        while self.replies:
            for slot, reply in list(self.replies.items()):
                self._next_piece(slot, reply)
            if time.perf_counter() >= until:
                return

    def _next_piece(self, slot: int, reply: _Reply) -> None:
        try:
            piece = next(reply.pieces)
        except StopIteration:
            self.replies.pop(slot, None)
            piece = SlotOutput(audio=np.zeros(0, np.float32), end_of_turn=True)  # ended without saying so
        except Exception as exc:  # noqa: BLE001
            logger.exception("chat reply of slot %d failed", slot)
            self.replies.pop(slot, None)
            _post(reply, "chat_failed", f"chat failed: {type(exc).__name__}: {exc}")
            return
        if piece.end_of_turn:
            self.replies.pop(slot, None)
        pcm16 = encode_pcm16_many([piece.audio])[0] if piece.audio.size else b""
        _post(reply, "chat_output", piece, pcm16)


def _post(reply: _Reply, method: str, *args: object) -> None:
    try:
        reply.loop.call_soon_threadsafe(getattr(reply.listener, method), *args)
    except RuntimeError:  # the loop is gone (a finished test): nobody reads this reply
        pass
