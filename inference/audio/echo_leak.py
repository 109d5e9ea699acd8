"""Did the agent hear itself? The agent's audio found again in the caller's microphone, with its level and delay.

If the caller's speakers feed what they play back into their microphone (no headphones, echo cancellation
that let it through), the microphone holds a delayed, quieter copy of what the caller heard. The delay is
the peak of the whitened cross-correlation of the two over ``MAX_DELAY_S`` (playback buffering plus the
acoustic path), and the leak level is the least-squares gain of that delayed copy, in dB. Users of
full-duplex systems report this first (the bot interrupting itself on speakerphone, pipecat-ai/pipecat#188).

One piece of maths for both uses: a finished recording's whole call (``measure_echo``, through
``inference.api`` for the web tier) and a live call's short windows (``inference.session.echo_watch``, which
lines up what the caller heard with their microphone from the playback acks and calls ``find_echo``).
Pure: numpy and scipy only.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import scipy.fft

MAX_DELAY_S = 1.0
ANALYSIS_RATE = 8000  # echo lives in the speech band: a lower rate keeps the FFTs small
FLAG_DB = -35.0  # a copy louder than this is enough for the agent to hear (and answer) itself
# The whitened peak must stand this many robust deviations above the other lags: the caller's own voice
# keeps the plain coefficient small (a -20 dB copy under speech scores about 0.1), so it cannot decide.
# Measured on 8 s of two unrelated speech-like tracks: chance peaks reach 7-8.2; a -30 dB copy 12-14,
# a -20 dB copy about 38.
MIN_PEAK_SIGMAS = 11.0
MIN_AGENT_RMS = 1e-3  # an agent that never spoke cannot leak
_NOTHING = {"flagged": False, "leak_db": None, "delay_ms": None, "correlation": 0.0, "peak_sigmas": 0.0}
# The agent was silent: nothing was measured, and such a window says nothing either way about an echo (a call's
# consensus leaves it out: webapp/recordings/echo_leak.py). NOT_FOUND: the agent spoke and no echo stood out.
AGENT_SILENT = _NOTHING | {"agent_silent": True}
NOT_FOUND = _NOTHING | {"agent_silent": False}


class EchoLeakError(ValueError):
    """The tracks cannot be compared (not 1-D, a rate that is not positive)."""


def measure_echo(caller: np.ndarray, agent: np.ndarray, rate: int) -> dict[str, Any]:
    """``{"flagged", "leak_db", "delay_ms", "correlation", "peak_sigmas", "agent_silent"}`` of two tracks on one
    clock (leak and delay None when no echo is found)."""
    return find_echo(heard=to_analysis_rate(agent, rate), mic=to_analysis_rate(caller, rate))


def find_echo(*, heard: np.ndarray, mic: np.ndarray) -> dict[str, Any]:
    """The echo of ``heard`` (what the caller's speakers played) in ``mic``, both float at ``ANALYSIS_RATE`` on
    one clock (sample ``t`` of each is the same instant); the longer one is cut to the shorter."""
    x, y = np.asarray(heard, np.float64), np.asarray(mic, np.float64)
    n = min(len(x), len(y))
    x, y = x[:n], y[:n]
    if n < 2 or np.sqrt(np.mean(x**2)) < MIN_AGENT_RMS:
        return dict(AGENT_SILENT)
    max_lag = min(n - 1, int(MAX_DELAY_S * ANALYSIS_RATE))
    # Lags 0..max_lag only: zero padding to n + max_lag keeps them free of wrap-around, at a fast FFT length.
    size = scipy.fft.next_fast_len(n + max_lag, real=True)
    spectrum = scipy.fft.rfft(y, size) * np.conj(scipy.fft.rfft(x, size))  # y[t] against x[t - lag]: mic later
    # Which lag: GCC-PHAT (the cross-spectrum whitened) gives a sharp peak at a true delay whatever the
    # voices' spectra, and lags with nothing in common look like independent noise, so a peak far above
    # their spread (in robust deviations) is an echo, not chance.
    phat = scipy.fft.irfft(spectrum / np.maximum(np.abs(spectrum), 1e-12), size)[: max_lag + 1]
    lag = int(np.argmax(phat))
    centre = float(np.median(phat))
    spread = 1.4826 * float(np.median(np.abs(phat - centre)))
    sigmas = (float(phat[lag]) - centre) / max(spread, 1e-12)
    energy_x = np.concatenate(([0.0], np.cumsum(x**2)))
    energy_y = np.concatenate(([0.0], np.cumsum(y**2)))
    ex = energy_x[n - lag]  # the overlapping parts at that lag: x[0 : n-lag] and y[lag : n]
    ey = energy_y[n] - energy_y[lag]
    cross = float(np.dot(y[lag:], x[: n - lag]))  # the plain cross-correlation at that lag only: one FFT fewer
    correlation = cross / np.sqrt(max(ex * ey, 1e-20))
    if sigmas < MIN_PEAK_SIGMAS:
        return {**NOT_FOUND, "correlation": round(float(correlation), 3), "peak_sigmas": round(sigmas, 1)}
    gain = cross / max(ex, 1e-20)  # least squares: y[t] ~ gain * x[t - lag]
    leak_db = 20 * np.log10(max(abs(float(gain)), 1e-10))
    return {
        "flagged": bool(leak_db > FLAG_DB),
        "leak_db": round(float(leak_db), 1),
        "delay_ms": round(lag * 1000.0 / ANALYSIS_RATE, 1),
        "correlation": round(float(correlation), 3),
        "peak_sigmas": round(sigmas, 1),
        "agent_silent": False,
    }


def to_analysis_rate(track: np.ndarray, rate: int) -> np.ndarray:
    """One channel (int16 or float) as float64 at ``ANALYSIS_RATE``; a typed error for anything else."""
    from scipy.signal import resample_poly

    if rate <= 0:
        raise EchoLeakError(f"sample rate must be positive, not {rate}")
    samples = np.asarray(track)
    if samples.ndim != 1:
        raise EchoLeakError(f"a track is one channel; got shape {samples.shape}")
    floats = samples.astype(np.float64) / (32768.0 if samples.dtype.kind in "iu" else 1.0)
    if rate != ANALYSIS_RATE and floats.size:
        g = np.gcd(rate, ANALYSIS_RATE)
        up, down = ANALYSIS_RATE // g, rate // g
        floats = resample_poly(floats, up, down, window=_resampling_filter(up, down))
    return floats


@functools.cache
def _resampling_filter(up: int, down: int) -> np.ndarray:
    """resample_poly's own default low-pass for this ratio, designed once (a live call resamples every window)."""
    from scipy.signal import firwin

    half_len = 10 * max(up, down)
    return firwin(2 * half_len + 1, 1 / max(up, down), window=("kaiser", 5.0))  # resample_poly scales it by up
