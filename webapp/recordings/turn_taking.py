"""Turn-taking metrics of one call, from its two aligned tracks and its recorded events. Pure: numpy only.

Who spoke when comes from a simple energy voice-activity detector run on each track separately (the
caller's microphone, the agent's generated audio); the measures are then read off the two activity
timelines. Definitions follow Full-Duplex-Bench (G.-T. Lin et al., "Full-Duplex-Bench: A Benchmark to
Evaluate Full-Duplex Spoken Dialogue Models on Turn-taking Capabilities", arXiv:2503.04721, §III,
and its v1.5, arXiv:2507.23159, §2-3, which adds the stop latency of an interruption):

- *Smooth turn-taking latency*: the time from the end of the user's turn to the start of the model's
  response (FDB §III "turn-taking"). Here: a caller utterance ends, both are silent, the agent's next
  utterance that is not a backchannel starts: ``response_latency_s`` is that silence.
- *Backchannel*: a short listener utterance ("uh-huh", "yeah") that does not take the floor (FDB
  §III "backchanneling"; the benchmark separates it from a takeover by its brevity). Here: an
  utterance of at most ``BACKCHANNEL_MAX_S`` that starts while the other side is speaking (or pausing
  inside its turn) and after which the other side goes on.
- *Takeover / user interruption*: the user starts speaking while the model is speaking; the model
  should stop and respond (FDB §III "user interruption"); v1.5 measures ``t_stop``, from the onset of
  the overlapping user speech to the model falling silent. Here: a caller utterance (not a backchannel)
  starting while the agent speaks is an interruption; the agent *yielded* when it falls silent before
  the caller does, and ``stop_latency_s`` is the time it kept talking.
- *Pause handling*: a silence inside one speaker's turn, which the model should not take as the end of
  the turn (FDB §III "pause handling"). Here: a silence of at least ``MIN_PAUSE_S`` between two
  utterances of the same speaker with nobody else speaking (an agent that speaks into a caller's pause
  has taken the turn: that silence is a response latency, and the caller resuming over it a cut-in).
- *Overlap*: any stretch where both tracks are active; the one who started second "cut in".

The detector bridges silences shorter than ``BRIDGE_S`` (stops inside words) and drops blips shorter
than ``MIN_SPEECH_S``; edges land on ``FRAME_S`` frames, so measured times are within a frame or two
of the truth on clean tracks. Echo of the agent in the caller's microphone counts as caller speech:
the echo measurement, not this module, says when a call suffered it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

FRAME_S = 0.01
THRESHOLD_DBFS = -40.0  # frame RMS above this is speech; floor noise of a headset sits near -60
BRIDGE_S = 0.2  # a shorter silence is a stop inside a word, not a pause
MIN_SPEECH_S = 0.06  # a shorter burst is a click
MIN_PAUSE_S = BRIDGE_S
BACKCHANNEL_MAX_S = 1.0
CALLER, AGENT = "caller", "agent"


class TurnTakingError(ValueError):
    """The tracks cannot be measured (not 1-D, a rate that is not positive)."""


@dataclass(frozen=True)
class Segment:
    speaker: str
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


def voice_activity(track: np.ndarray, rate: int, threshold_dbfs: float = THRESHOLD_DBFS) -> list[tuple[float, float]]:
    """(start, end) seconds of each utterance of one int16 (or float in [-1, 1]) mono track."""
    if rate <= 0:
        raise TurnTakingError(f"sample rate must be positive, not {rate}")
    samples = np.asarray(track)
    if samples.ndim != 1:
        raise TurnTakingError(f"a track is one channel; got shape {samples.shape}")
    scale = 32768.0 if samples.dtype.kind in "iu" else 1.0
    frame = max(1, round(rate * FRAME_S))
    n = len(samples) // frame
    if n == 0:
        return []
    frames = samples[: n * frame].astype(np.float64).reshape(n, frame) / scale
    rms = np.sqrt(np.mean(frames**2, axis=1))
    active = 20 * np.log10(np.maximum(rms, 1e-10)) > threshold_dbfs
    runs = _runs(active)
    bridged: list[list[int]] = []
    for start, end in runs:
        if bridged and (start - bridged[-1][1]) * FRAME_S < BRIDGE_S:
            bridged[-1][1] = end
        else:
            bridged.append([start, end])
    return [
        (round(s * frame / rate, 3), round(e * frame / rate, 3))
        for s, e in bridged
        if (e - s) * FRAME_S >= MIN_SPEECH_S
    ]


def _runs(active: np.ndarray) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate(([0], active.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))


def measure(
    caller: np.ndarray,
    agent: np.ndarray,
    rate: int,
    *,
    events: Iterable[dict[str, Any]] = (),
    period_ms: int = 80,
    step_time: Callable[[int], float] | None = None,
) -> dict[str, Any]:
    """The call's turn-taking metrics as a JSON-ready dict (times in seconds, rounded to the ms).

    ``step_time`` places an engine step on the tracks' clock (a recording's, which keeps the call's wall-clock time):
    the engine's barge-ins are read there, as the review timeline marks them; without it, a step is ``period_ms``.
    """
    segments = sorted(
        [Segment(CALLER, s, e) for s, e in voice_activity(caller, rate)]
        + [Segment(AGENT, s, e) for s, e in voice_activity(agent, rate)],
        key=lambda seg: (seg.start, seg.end),
    )
    backchannels = [seg for seg in segments if _is_backchannel(seg, segments)]
    turns = [seg for seg in segments if seg not in backchannels]
    latencies: list[float] = []
    responses: list[dict[str, float]] = []  # where each response latency lies, for the review's strip
    caller_latencies: list[float] = []
    pauses: list[dict[str, Any]] = []
    agent_cut_in = 0
    last = turns[0] if turns else None  # of the turns before ``current``, the one that stopped last
    for current in turns[1:]:
        gap = current.start - last.end
        previous, last = last, max(last, current, key=lambda seg: seg.end)
        if gap < 0:
            continue  # starts under someone's speech: an overlap, counted below
        if previous.speaker == current.speaker:
            if gap >= MIN_PAUSE_S:
                pauses.append({"speaker": current.speaker, "start": _r(previous.end), "length_s": _r(gap)})
        elif current.speaker == AGENT:
            latencies.append(gap)
            responses.append({"start": _r(previous.end), "length_s": _r(gap)})
        else:
            caller_latencies.append(gap)
    overlaps: list[dict[str, Any]] = []
    interruptions: list[dict[str, Any]] = []
    for later in turns:
        for earlier in turns:
            if earlier.speaker == later.speaker or not earlier.start <= later.start < earlier.end:
                continue
            overlap = min(earlier.end, later.end) - later.start
            overlaps.append({"start": _r(later.start), "length_s": _r(overlap), "cut_in": later.speaker})
            if later.speaker == CALLER:
                yielded = earlier.end < later.end
                interruptions.append(
                    {
                        "start": _r(later.start),
                        "yielded": yielded,
                        "stop_latency_s": _r(earlier.end - later.start) if yielded else None,
                    }
                )
            else:
                agent_cut_in += 1
    caller_s = sum(seg.length for seg in segments if seg.speaker == CALLER)
    agent_s = sum(seg.length for seg in segments if seg.speaker == AGENT)
    yielded = [i for i in interruptions if i["yielded"]]
    return {
        "vad": {"frame_s": FRAME_S, "threshold_dbfs": THRESHOLD_DBFS, "bridge_s": BRIDGE_S},
        "segments": [[seg.speaker, _r(seg.start), _r(seg.end)] for seg in segments],
        "caller_talk_s": _r(caller_s),
        "agent_talk_s": _r(agent_s),
        "talk_ratio": _r(agent_s / (caller_s + agent_s)) if caller_s + agent_s else None,
        "response_latency_s": [_r(v) for v in latencies],
        "response_latency_mean_s": _mean(latencies),
        "responses": responses,
        "caller_response_latency_s": [_r(v) for v in caller_latencies],
        "overlaps": overlaps,
        "overlap_s": _r(sum(o["length_s"] for o in overlaps)),
        "caller_cut_in": sum(1 for o in overlaps if o["cut_in"] == CALLER),
        "agent_cut_in": agent_cut_in,
        "interruptions": interruptions,
        "interruptions_yielded": len(yielded),
        "stop_latency_mean_s": _mean([i["stop_latency_s"] for i in yielded]),
        "backchannels": [[seg.speaker, _r(seg.start), _r(seg.end)] for seg in backchannels],
        "agent_backchannels": sum(1 for seg in backchannels if seg.speaker == AGENT),
        "caller_backchannels": sum(1 for seg in backchannels if seg.speaker == CALLER),
        "pauses": pauses,
        "engine_barge_ins": _barge_ins(events, step_time or (lambda step: step * period_ms / 1000.0)),
    }


def _is_backchannel(seg: Segment, segments: list[Segment]) -> bool:
    """Short, started while the other side held the floor, and the other side went on after it."""
    if seg.length > BACKCHANNEL_MAX_S:
        return False
    others = [o for o in segments if o.speaker != seg.speaker]
    holding = any(o.start <= seg.start < o.end + BRIDGE_S for o in others)  # speaking, or just paused
    goes_on = any(o.end > seg.end for o in others if o.start <= seg.end + BACKCHANNEL_MAX_S)
    return holding and goes_on


def _barge_ins(events: Iterable[dict[str, Any]], step_time: Callable[[int], float]) -> list[float]:
    """When the engine itself recorded a barge-in (an epoch that is not a new response), in seconds."""
    times = []
    for event in events:
        if isinstance(event, dict) and event.get("k") == "epoch" and not event.get("response"):
            step = event.get("step", 0)
            if isinstance(step, int | float):
                times.append(_r(step_time(int(step))))
    return sorted(times)


def _r(value: float) -> float:
    return round(float(value), 3)


def _mean(values: list[float]) -> float | None:
    return _r(sum(values) / len(values)) if values else None
