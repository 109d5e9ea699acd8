"""Half-duplex server events: ``input_audio_buffer.speech_started`` / ``speech_stopped`` / ``committed``
and the response per turn, rendered from the facade's turn events (bookkeeping only, no I/O).

The user item's id is minted when speech starts, so ``speech_started``, ``speech_stopped`` and
``committed`` name the same item, as OpenAI's do.
"""

from __future__ import annotations

from inference.contracts import ResponseEnded, ResponseStarted, SpeechStarted, SpeechStopped, TurnCommitted
from webapp.conversations.server_events import Outgoing, RealtimeEvents, new_id

TurnEvent = SpeechStarted | SpeechStopped | TurnCommitted | ResponseStarted | ResponseEnded


class TurnEvents:
    def __init__(self, events: RealtimeEvents):
        self.events = events
        self._item_id: str | None = None  # the user item being spoken, from speech_started to committed

    def render(self, event: TurnEvent) -> list[Outgoing]:
        events = self.events
        match event:
            case SpeechStarted():
                self._item_id = new_id("item")
                return [
                    events.event(
                        "input_audio_buffer.speech_started", audio_start_ms=event.audio_start_ms, item_id=self._item_id
                    )
                ]
            case SpeechStopped():
                item_id = self._item_id or new_id("item")
                self._item_id = item_id
                return [
                    events.event("input_audio_buffer.speech_stopped", audio_end_ms=event.audio_end_ms, item_id=item_id)
                ]
            case TurnCommitted():
                item_id, self._item_id = self._item_id or new_id("item"), None
                previous = events.previous_item_id
                return [
                    events.event("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id),
                    events.add_user_item(item_id),
                ]
            case ResponseStarted():
                return events.open_response(event.epoch)
            case ResponseEnded():
                return events.end_response_of(event.epoch, event.status)
        return []
