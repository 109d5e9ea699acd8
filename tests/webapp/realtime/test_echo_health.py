"""The live echo warning's words: one status on the first leaking window, one when it has stopped leaking."""

from __future__ import annotations

import pytest

from webapp.conversations import protocol
from webapp.conversations.echo_health import CLEAN_WINDOWS_TO_CLEAR, EchoHealth

LEAK = {"echo_flagged": 1.0, "echo_peak_sigmas": 14.0, "echo_leak_db": -20.0, "echo_delay_ms": 60.0}
CLEAN = {"echo_flagged": 0.0, "echo_peak_sigmas": 5.0}


def test_the_first_leaking_window_warns_once_and_clean_windows_take_it_back():
    health = EchoHealth()
    assert health.update({"tick_ms_p50": 3.0}) is None  # a second without a window says nothing
    warning = health.update(LEAK)
    assert warning.level == "warning" and warning.code == "echo_leak" and "use headphones" in warning.message
    assert health.update(LEAK) is None  # only on a change
    for _ in range(CLEAN_WINDOWS_TO_CLEAR - 1):
        assert health.update(CLEAN) is None
    cleared = health.update(CLEAN)
    assert cleared.level == "ok" and cleared.code == "echo_gone"


def test_a_call_without_a_leak_is_never_warned():
    health = EchoHealth()
    assert all(health.update(CLEAN) is None for _ in range(10))


def test_playback_ack_instants_are_checked():
    ack = protocol.parse_client_event('{"type": "playback.ack", "played_ms": 500, "heard": [[12000, 9600]]}')
    assert ack.heard == [(12000, 9600)]
    assert protocol.parse_client_event('{"type": "playback.ack", "played_ms": 5}').heard == []
    for heard in ("[[1, -2]]", "[[1, 2, 3]]", '[["a", 2]]', str([[1, 2]] * 65), "[[1, 1e30]]"):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_client_event(f'{{"type": "playback.ack", "played_ms": 5, "heard": {heard}}}')
