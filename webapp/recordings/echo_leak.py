"""Did the agent hear itself? One call's echo leak, from what the live call measured or from its two tracks.

During the call the inference session measured a window every few seconds, with what the caller heard lined
up with their microphone by the page's playback acks (inference/session/echo_watch.py); each window is an
``echo`` event in the raw recording. Those windows are the call's echo over time, and their consensus is its
echo: the leak and the delay are the acoustic path's own. A call without them (a client whose acks name no
positions) is measured on its recorded tracks instead (``inference.api.measure_echo``), where the delay also
holds the network's round trip and the jitter buffer, and says so (``source``).
"""

from __future__ import annotations

from statistics import median
from typing import Any

from inference import api

# A call is flagged when at least this share of its windows in which the agent spoke was: one chance window
# among many is not an echo, a speaker that leaks does so whenever the agent talks. Windows in which the agent
# was silent say nothing either way and are left out (a call whose agent paused often would otherwise never
# reach the share, however loud its leak).
FLAGGED_SHARE = 1 / 3
WINDOW_FIELDS = ("t", "flagged", "leak_db", "delay_ms", "peak_sigmas", "agent_silent")


def echo_of_call(events: list[dict[str, Any]], caller, agent, rate: int) -> dict[str, Any]:
    """``{"flagged", "leak_db", "delay_ms", "source", "windows"?}`` of one recorded call."""
    windows = [{k: event.get(k) for k in WINDOW_FIELDS} for event in events if event.get("k") == "echo"]
    if not windows:
        return api.measure_echo(caller, agent, rate) | {"source": "tracks"}
    spoken = [w for w in windows if not _agent_silent(w)]
    flagged = [w for w in spoken if w["flagged"]]
    is_flagged = len(flagged) >= max(1, FLAGGED_SHARE * len(spoken))
    found = flagged or [w for w in windows if w["leak_db"] is not None]
    return {
        "flagged": is_flagged,
        "leak_db": round(median(w["leak_db"] for w in found), 1) if found else None,
        "delay_ms": round(median(w["delay_ms"] for w in found), 1) if found else None,
        "source": "live",
        "windows": windows,
        "flagged_windows": len(flagged),
    }


def _agent_silent(window: dict[str, Any]) -> bool:
    """Recordings made before windows said so: a silent agent's window is the only one measured as nothing."""
    if window.get("agent_silent") is not None:
        return bool(window["agent_silent"])
    return window.get("leak_db") is None and not window.get("peak_sigmas")
