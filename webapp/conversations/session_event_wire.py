"""The session's events that become server events with no more to do: what each one says on the wire.

``RealtimeConsumer`` sends what ``SessionEventWire.render`` returns. The events that change the consumer's own
state or end its socket (``Ready``, ``ErrorEvent``, ``Replaced``, ``Closed``) render as ``None``: the consumer
handles those itself. Bookkeeping only, no I/O; the per-frame ``AudioOut`` is matched first.
"""

from __future__ import annotations

from inference.contracts import (
    AudioOut,
    Decision,
    Metrics,
    Paused,
    Prefill,
    Queued,
    ResponseEnded,
    ResponseStarted,
    Resumed,
    SessionEvent,
    SpeechStarted,
    SpeechStopped,
    TextOut,
    TurnCommitted,
)
from webapp.conversations.echo_health import EchoHealth
from webapp.conversations.server_events import Outgoing, RealtimeEvents
from webapp.conversations.server_health import ServerHealth
from webapp.conversations.turn_events import TurnEvents


class SessionEventWire:
    """One call's translation of session events into server events (``docs/protocol.md``)."""

    def __init__(self, events: RealtimeEvents):
        self.events = events
        self.turn_events = TurnEvents(events)
        self.health = ServerHealth()  # turns the metrics into "the server is behind" in words
        self.echo_health = EchoHealth()  # and the live echo windows into "use headphones"

    def render(self, event: SessionEvent) -> list[Outgoing] | None:
        """The server events ``event`` becomes, or ``None`` for an event the consumer handles itself."""
        events = self.events
        match event:
            case AudioOut():
                return events.audio(event)
            case TextOut():
                return events.text(event)
            case Metrics():
                outgoing = [events.event("session.metrics", metrics=dict(event.values))]
                for health in (self.health, self.echo_health):
                    if (status := health.update(event.values)) is not None:
                        outgoing.append(
                            events.event("session.status", level=status.level, code=status.code, message=status.message)
                        )
                return outgoing
            case Decision():
                return [events.event(f"response.{event.kind}", unit=event.unit, end_of_turn=event.end_of_turn)]
            case SpeechStarted() | SpeechStopped() | TurnCommitted() | ResponseStarted() | ResponseEnded():
                return self.turn_events.render(event)
            case Queued():
                fields = {"position": event.position, "queue_length": event.queue_length}
                return [events.event("session.queued", **fields, estimated_wait_s=event.estimated_wait_s)]
            case Prefill():
                return [events.event("session.prefill", progress=event.progress, done=event.done)]
            case Paused():
                return [events.event("session.paused")]
            case Resumed():
                return [events.event("session.resumed")]
        return None
