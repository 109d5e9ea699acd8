"""``SessionEventWire``: which session events it renders itself, and what they say (no socket, no session)."""

from __future__ import annotations

import pytest

from inference.contracts import Closed, ErrorEvent, Metrics, Paused, Queued, Ready, Replaced
from webapp.conversations.server_events import RealtimeEvents, SessionView
from webapp.conversations.session_event_wire import SessionEventWire


@pytest.fixture
def wire() -> SessionEventWire:
    return SessionEventWire(RealtimeEvents(SessionView(model="echo", input_rates=(24_000,))))


def test_events_that_change_the_consumers_state_are_left_to_it(wire):
    ready = Ready(session_id="sess_x", resumed=False, capabilities=None, persona=None, voice=None, recorded=True)
    for event in (ready, ErrorEvent("engine_failed", "x"), Replaced(), Closed("client_close")):
        assert wire.render(event) is None, event


def test_plain_events_render_with_their_fields(wire):
    assert [e["type"] for e in wire.render(Paused())] == ["session.paused"]
    (queued,) = wire.render(Queued(position=2, queue_length=3, estimated_wait_s=4.5))
    assert (queued["type"], queued["position"], queued["queue_length"], queued["estimated_wait_s"]) == (
        "session.queued", 2, 3, 4.5,
    )  # fmt: skip


def test_metrics_that_show_the_server_behind_add_the_status_in_words_once(wire):
    first = wire.render(Metrics({"dropped_frames": 0, "late_ticks": 0}))
    assert [e["type"] for e in first] == ["session.metrics"]
    behind = wire.render(Metrics({"dropped_frames": 5, "late_ticks": 0}))
    assert [e["type"] for e in behind] == ["session.metrics", "session.status"]
    assert (behind[1]["level"], behind[1]["code"]) == ("warning", "server_behind")
    still_behind = wire.render(Metrics({"dropped_frames": 9, "late_ticks": 0}))
    assert [e["type"] for e in still_behind] == ["session.metrics"]  # said once, not every second
