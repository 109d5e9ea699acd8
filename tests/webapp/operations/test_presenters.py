"""The occupancy presenters: chart geometry and the JSON document, from hand-made snapshots."""

from __future__ import annotations

import json

import pytest

from inference.contracts import SlotSnapshot, WorkerSnapshot
from webapp.operations.presenters import (
    CHART_HEIGHT,
    CHART_PAD_BOTTOM,
    CHART_PAD_LEFT,
    CHART_PAD_TOP,
    CHART_WIDTH,
    occupancy_payload,
    tick_chart,
    worker_rows,
)


def snapshot(**overrides) -> WorkerSnapshot:
    fields = {
        "engine": "echo",
        "device": "cpu",
        "num_slots": 3,
        "slots": (
            SlotSnapshot(slot=0, state="live", session_id="sess_a", user_key="7", age_s=12.0),
            SlotSnapshot(slot=1, state="free"),
            SlotSnapshot(slot=2, state="prefilling", session_id="sess_b", user_key="8"),
        ),
        "queue_length": 2,
        "tick_ms_p50": 1.5,
        "tick_ms_p99": 4.0,
        "recent_tick_ms": (1.0, 2.0, 4.0),
        "memory": {"allocated": 3 * 1024**3},
    }
    return WorkerSnapshot(**{**fields, **overrides})


def test_tick_chart_scales_points_into_the_plot_box():
    chart = tick_chart((0.0, 50.0, 100.0), budget_ms=80.0)
    points = [tuple(map(float, p.split(","))) for p in chart.points.split()]
    bottom, top = CHART_HEIGHT - CHART_PAD_BOTTOM, CHART_PAD_TOP
    assert chart.y_max_ms == 100
    assert points[0] == (CHART_PAD_LEFT, bottom)  # 0 ms on the zero line, first tick at the left
    assert points[-1] == (CHART_WIDTH, top)  # the maximum at the top right
    assert points[1][1] == (bottom + top) / 2
    assert chart.budget_y == pytest.approx(bottom - 0.8 * (bottom - top), abs=0.05)
    assert [label for _, label in chart.gridlines] == ["0", "50", "100"]


def test_tick_chart_axis_covers_the_budget_and_handles_no_ticks():
    chart = tick_chart((), budget_ms=80.0)
    assert chart.empty and chart.points == ""
    assert chart.y_max_ms == 100  # 80 ms rounded up to a readable axis
    assert tick_chart((0.3, 0.4)).y_max_ms == 1  # sub-millisecond engines still get an axis
    assert tick_chart((-1.0, 3.0)).points.count(",") == 1  # negative (bogus) values are not drawn


def test_worker_rows_name_users_and_count_states():
    (row,) = worker_rows([snapshot()], budgets_ms={"echo": 80.0}, usernames={"7": "alice"})
    assert row["busy"] == 2
    assert dict(row["counts"]) == {"live": 1, "free": 1, "prefilling": 1}
    assert [entry["username"] for entry in row["slots"]] == ["alice", None, "8"]  # unknown keys shown as is
    assert row["chart"].budget_ms == 80.0
    assert row["memory"] == [("allocated", "3.0 GiB")]


def test_occupancy_payload_is_json_with_live_session_ids():
    payload = occupancy_payload([snapshot(), snapshot(engine="moshi", queue_length=1, slots=(), num_slots=0)])
    document = json.loads(json.dumps(payload))
    assert document["total_slots"] == 3
    assert document["busy_slots"] == 2
    assert document["queue_length"] == 3
    assert document["session_ids"] == ["sess_a", "sess_b"]
    assert document["workers"][0]["slots"][0] == {
        "slot": 0,
        "state": "live",
        "session_id": "sess_a",
        "user_key": "7",
        "age_s": 12.0,
    }
