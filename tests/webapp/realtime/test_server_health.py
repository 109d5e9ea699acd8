"""ServerHealth: metrics reports -> at most one "the server is behind" / "caught up" change."""

from webapp.conversations.server_health import BEHIND, GOOD_REPORTS_TO_CLEAR, ServerHealth


def report(**values: float) -> dict[str, float]:
    return {"dropped_frames": 0, "trimmed_frames": 0, "late_ticks": 0, "lag_ms": 0.0, "out_lag_ms": 0.0, **values}


def test_dropped_frames_warn_once_and_clear_after_reports_in_a_row_without_trouble():
    health = ServerHealth()
    assert health.update(report(dropped_frames=4)) is None  # the first report has no baseline for counters
    warned = health.update(report(dropped_frames=6))
    assert warned is not None and (warned.level, warned.code, warned.message) == ("warning", "server_behind", BEHIND)
    assert health.update(report(dropped_frames=9)) is None  # still behind: said once
    for _ in range(GOOD_REPORTS_TO_CLEAR - 1):
        assert health.update(report(dropped_frames=9)) is None
    cleared = health.update(report(dropped_frames=9))
    assert cleared is not None and (cleared.level, cleared.code) == ("ok", "server_caught_up")


def test_late_ticks_and_queued_audio_warn_but_network_trims_and_a_stray_late_tick_do_not():
    health = ServerHealth()
    health.update(report())
    assert health.update(report(dropped_frames=3, trimmed_frames=3)) is None  # the caller's network, not the server
    assert health.update(report(dropped_frames=3, trimmed_frames=3, late_ticks=1)) is None
    assert health.update(report(dropped_frames=3, trimmed_frames=3, late_ticks=5)).code == "server_behind"
    other = ServerHealth()
    assert other.update(report(out_lag_ms=800.0)).code == "server_behind"  # audio queued up, from the first report
    caller = ServerHealth()  # a standing queue of the caller's own speech is not the server falling behind
    assert caller.update(report(lag_ms=800.0)) is None
    preparing = ServerHealth()  # audio spoken while the model prepared was discarded: not the server behind
    preparing.update(report())
    assert preparing.update(report(dropped_frames=3, prefill_dropped_frames=3)) is None
    assert preparing.update(report(dropped_frames=5, prefill_dropped_frames=3)).code == "server_behind"


def test_a_good_report_in_a_bad_stretch_does_not_clear_the_warning():
    health = ServerHealth()
    health.update(report())
    health.update(report(late_ticks=10))
    for late in (10, 20, 20, 30):  # good, bad, good, bad
        assert health.update(report(late_ticks=late)) is None
    assert health.behind
