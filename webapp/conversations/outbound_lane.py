"""A live call's audio and text events from its session straight onto its socket: no queue, no task wake-up.

A live call's session makes an ``AudioOut`` each 80 ms tick, and ``TextOut`` as the agent speaks. Through the
ordinary path each one went into the handle's queue (the in-process ``Outbox`` or the link handle's
``asyncio.Queue``), woke the socket's pump task, went through ``_on_session_event`` and the socket's send lock,
and was then written by the socket lane: a task's wake-up for each write, 2 500 a second at 200 callers on one
web process. At 200 lines the events out were about 7 % of the daphne's interpreter samples
(bench/notes/serving-e2e.md, "Where the daphne's interpreter goes at 200 lines with the lane").

With this lane the handle offers each event to ``OutboundLane.take`` as it arrives
(``SessionHandle.send_events_directly``), and an audio or text event is rendered and written to the socket lane
right there, in the callback that delivered it, when the ordinary path would have sent the same bytes at once
and nothing of this call is pending. Everything else (the session's other events, an event while anything is
pending, a socket that is closing or not in the socket lane's plain state) is queued for the pump as before.

Order. The session's events of one call reach the client in the order it made them, and server events in the
order of their ``server_event_seq``, because an event is taken only when nothing earlier can still be on its
way. The handle's queue is empty (the handle checks it), so no earlier session event waits there; a pump woken
for a queued event but not yet run leaves that event in the queue. The pump is parked awaiting the next event
(``may_send``), so it holds no event it took and has not sent. No ``_emit`` is under way or waiting for the send
lock (``may_send``), so no rendered server event, the pump's or the consumer's own (stamped earlier), waits to
be written; the lock being free is not enough, as a released lock is free before the waiter it woke has run.
The socket lane can write now, so nothing waits in autobahn's queue. And no catch-up (below) is pending. The
event is then rendered and all its messages written before any other code of the loop runs.

If a write is refused midway (it should not be: the socket lane's state was checked just before and writing
changes none of it), the event's rest goes to a task running the consumer's ``_emit``, and this lane takes
nothing until that task ends, so later events queue for the pump; the task's first step was scheduled before the
pump can be woken for them, so the send lock (FIFO) serves it first. A barge-in needs nothing here: an event sent
directly has already left, as one the pump took.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from inference import api
from inference.contracts import AudioOut, SessionEvent, TextOut
from webapp.conversations.server_events import Outgoing
from webapp.conversations.socket_lane import SocketLane
from webapp.operations.metrics import MESSAGES_SENT, OUTPUT_EVENTS, count_error

_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))  # one encoder: json.dumps builds one a call (~2.5 us)
DIRECT_EVENTS = (AudioOut, TextOut)  # the per-tick events of a live call; every other event takes the pump


def wire_message(item: Outgoing) -> bytes | str:
    """A server event as its WebSocket message: an audio frame as it is, a JSON event compact (an error counted)."""
    if isinstance(item, bytes):
        return item
    if item.get("type") == "error":
        count_error(item["error"]["code"])  # the process's /ops/metrics, by code
    return _COMPACT_JSON.encode(item)


class OutboundLane:
    """Takes one socket's live-call events from its session handle until ``remove`` (see the module's note).

    Args:
        handle: the socket's session handle; the lane registers itself on it.
        lane: the socket lane that writes the messages.
        render: the server events a session event becomes (``SessionEventWire.render``).
        may_send: the consumer's half of the condition: its pump is parked, nothing is being sent or waits for
            the send lock, the socket is open and the session not finished.
        emit: the consumer's ordinary send of server events (``_emit``), for the rest of an event the socket
            lane refused midway.
    """

    def __init__(
        self,
        handle: api.SessionHandle,
        lane: SocketLane,
        render: Callable[[SessionEvent], list[Outgoing] | None],
        may_send: Callable[[], bool],
        emit: Callable[[list[Outgoing]], Awaitable[None]],
    ):
        self.handle, self.lane, self.render, self.may_send, self.emit = handle, lane, render, may_send, emit
        self.catching_up: asyncio.Task | None = None  # the rest of an event the socket lane refused midway
        handle.send_events_directly(self.take)

    def take(self, event: SessionEvent) -> bool:
        """True once ``event`` was sent (or rendered to nothing); False to queue it for the pump."""
        if (
            not isinstance(event, DIRECT_EVENTS)
            or self.catching_up is not None
            or not self.may_send()
            or not self.lane.writable()
        ):
            return False
        try:
            outgoing = self.render(event) or []
        except Exception:  # noqa: BLE001 - nothing was written: the pump meets it again, inside its fault edge
            return False
        for i, item in enumerate(outgoing):
            if not self.lane.send(wire_message(item)):
                self.catching_up = asyncio.create_task(self._catch_up(outgoing[i:]))
                break
            MESSAGES_SENT["lane"] += 1
        OUTPUT_EVENTS["direct"] += 1
        return True

    async def _catch_up(self, rest: list[Outgoing]) -> None:
        try:
            await self.emit(rest)
        finally:
            self.catching_up = None

    def remove(self) -> None:
        """Events queue for the pump again, and the handle keeps no reference to the consumer."""
        self.handle.send_events_directly(None)
