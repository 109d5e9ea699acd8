"""Where each engine step of a recording lies on the call's wall-clock timeline, and the gaps between.

A step's audio is ``period`` long, but steps are not always ``period`` apart: a loaded host runs its
ticks late (a 16 s call once made 5 s of steps), a pause or a detach freezes the slot. Laid end to end
the steps would make a recording shorter than the call, its events in the wrong places. So each step
is laid at its wall-clock time (the TICK record's ``seconds``) whenever that is more than
``TOLERANCE_PERIODS`` past where it would follow the previous step, and the time between is silence,
kept as a gap with its cause. Smaller drift is absorbed (steps laid end to end), so a tick a few ms
late never cuts a click of silence into the audio; the drift stays under one tolerance.

A step that had no caller audio (the caller's frames did not arrive in time: the worker fed the engine
silence, and the recorder wrote no caller record) is silence too; a run of them is a gap of its own.

Chat recordings keep the concatenation of their audio (``inference.recording.chat_steps``): the minutes
spent typing are not laid out as silence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TOLERANCE_PERIODS = 1.0
MIN_CALLER_GAP_STEPS = 3  # shorter runs are jitter underruns (the call page counts those), not a gap
CHAT_EVENT = "chat"  # the event a chat recording starts with: its clock is its audio, not the wall


@dataclass
class Timeline:
    """``starts[k]``: step ``k``'s start in seconds on the recording's clock; ``duration_s``: the whole."""

    starts: list[float]
    duration_s: float
    gaps: list[dict[str, Any]] = field(default_factory=list)  # {"t", "end", "cause"}, seconds


def lay_out(
    ticks: list[tuple[int, float, float]],
    *,
    period_s: float,
    events: list[dict[str, Any]],
    caller_steps: set[int] | None,
    end_s: float | None,
) -> Timeline:
    """The timeline of a recording's steps.

    Args:
        ticks: (step, wall seconds since the recording began, tick ms), as recorded.
        period_s: the engine's step.
        events: the recording's events (pause/resume/detach/attach name a gap's cause; ``chat`` turns
            the wall clock off).
        caller_steps: the steps that have caller audio; None when the format writes it for every step.
        end_s: the wall time the recording ended (``end.json``), to keep a silent tail; None if unknown.
    """
    ordered = sorted(ticks)
    steps = ordered[-1][0] + 1 if ordered else 0
    chat = any(e.get("k") == CHAT_EVENT for e in events)
    if chat or not ordered:
        return Timeline([k * period_s for k in range(steps)], steps * period_s)
    tolerance = TOLERANCE_PERIODS * period_s
    freezes = sorted((int(e.get("step", 0)), str(e["k"])) for e in events if e.get("k") in ("pause", "detach"))
    starts: list[float] = []
    gaps: list[dict[str, Any]] = []
    # The recording's clock starts when it began (the call's first audio). A TICK's time is when its step was
    # done; less the step's own time, it is when the tick began, which is where the step's audio lies. The
    # first tick anchors the steps (the wait for it, under a period, is lead-in); drift is measured from it.
    first_step, first_wall, first_ms = ordered[0]
    base = max(0.0, first_wall - first_ms / 1000.0 - first_step * period_s)
    starts.extend(base + k * period_s for k in range(first_step + 1))
    previous = (first_step, starts[-1])
    for step, wall, step_ms in ordered[1:]:
        last_step, last_start = previous
        if step <= last_step:
            continue  # a duplicate tick record: the first one counts
        for missing in range(last_step + 1, step):  # steps lost to drops stay in place, silent
            starts.append(last_start + (missing - last_step) * period_s)
        nominal = last_start + (step - last_step) * period_s
        at = wall - step_ms / 1000.0
        if at - nominal > tolerance:
            cause = next((kind for s, kind in freezes if last_step < s <= step), "engine_behind")
            gaps.append({"t": round(nominal, 3), "end": round(at, 3), "cause": cause})
            starts.append(at)
        else:
            starts.append(nominal)
        previous = (step, starts[-1])
    audio_end = starts[-1] + period_s
    duration = audio_end
    if end_s is not None and not _left_detached(events) and end_s > audio_end:
        duration = end_s  # the call went on after its last step (the hang-up, a pause, a slow last tick)
        if end_s - audio_end > tolerance:
            gaps.append({"t": round(audio_end, 3), "end": round(end_s, 3), "cause": _tail_cause(events)})
    if caller_steps is not None:
        gaps.extend(_caller_gaps(ordered, caller_steps, starts, period_s))
    return Timeline(starts, duration, sorted(gaps, key=lambda g: g["t"]))


def _caller_gaps(ordered, caller_steps: set[int], starts: list[float], period_s: float) -> list[dict[str, Any]]:
    """Runs of ticked steps without caller audio, each one gap."""
    gaps = []
    run: list[int] = []
    for step, _, _ in [*ordered, (None, 0.0, 0.0)]:
        if step is not None and step not in caller_steps:
            run.append(step)
            continue
        if len(run) >= MIN_CALLER_GAP_STEPS:
            end = starts[run[-1]] + period_s
            gaps.append({"t": round(starts[run[0]], 3), "end": round(end, 3), "cause": "no_caller_audio"})
        run = []
    return gaps


def _left_detached(events: list[dict[str, Any]]) -> bool:
    """The caller's connection was gone when the recording ended (the grace ran out): no tail to keep."""
    state = None
    for e in events:
        if e.get("k") in ("detach", "attach"):
            state = e["k"]
    return state == "detach"


def _tail_cause(events: list[dict[str, Any]]) -> str:
    kinds = [e.get("k") for e in events if e.get("k") in ("pause", "resume")]
    return "pause" if kinds and kinds[-1] == "pause" else "engine_behind"
