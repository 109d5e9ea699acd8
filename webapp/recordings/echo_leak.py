"""Did the agent hear itself? Echo leak of one call: the agent's audio found again in the caller's microphone.

The agent's track is what the caller's browser was given to play; if the caller's speakers feed it back
into their microphone (no headphones, echo cancellation that let it through), the caller's track holds a
delayed, quieter copy. The delay is the peak of the normalised cross-correlation of the two tracks over
``MAX_DELAY_S`` (playback buffering plus the acoustic path), and the leak level is the least-squares gain
of that delayed copy, in dB. Pure: numpy only. Users of full-duplex systems report this first (the bot
interrupting itself on speakerphone, pipecat-ai/pipecat#188), so each call is measured and flagged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_DELAY_S = 1.0
ANALYSIS_RATE = 8000  # echo lives in the speech band: a lower rate keeps the FFTs of a long call small
FLAG_DB = -35.0  # a copy louder than this is enough for the agent to hear (and answer) itself
# The whitened peak must stand this many robust deviations above the other lags: the caller's own voice
# keeps the plain coefficient small (a -20 dB copy under speech scores about 0.1), so it cannot decide.
# Measured on 8 s of two unrelated speech-like tracks: chance peaks reach 7-8.2; a -30 dB copy 12-14,
# a -20 dB copy about 38.
MIN_PEAK_SIGMAS = 11.0
MIN_AGENT_RMS = 1e-3  # an agent that never spoke cannot leak


class EchoLeakError(ValueError):
    """The tracks cannot be compared (not 1-D, a rate that is not positive)."""


def measure_echo(caller: np.ndarray, agent: np.ndarray, rate: int) -> dict[str, Any]:
    """``{"flagged", "leak_db", "delay_ms", "correlation", "peak_sigmas"}`` (leak and delay None when no echo
    is found)."""
    x, y = _prepared(agent, rate), _prepared(caller, rate)
    n = min(len(x), len(y))
    x, y = x[:n], y[:n]
    quiet = {"flagged": False, "leak_db": None, "delay_ms": None, "correlation": 0.0, "peak_sigmas": 0.0}
    if n == 0 or np.sqrt(np.mean(x**2)) < MIN_AGENT_RMS:
        return quiet
    max_lag = min(n - 1, int(MAX_DELAY_S * ANALYSIS_RATE))
    size = 1 << int(np.ceil(np.log2(2 * n)))
    spectrum = np.fft.rfft(y, size) * np.conj(np.fft.rfft(x, size))
    cross = np.fft.irfft(spectrum, size)[: max_lag + 1]  # y[t] against x[t - lag], lag >= 0 (caller later)
    # Which lag: GCC-PHAT (the cross-spectrum whitened) gives a sharp peak at a true delay whatever the
    # voices' spectra, and lags with nothing in common look like independent noise, so a peak far above
    # their spread (in robust deviations) is an echo, not chance.
    phat = np.fft.irfft(spectrum / np.maximum(np.abs(spectrum), 1e-12), size)[: max_lag + 1]
    lag = int(np.argmax(phat))
    centre = float(np.median(phat))
    spread = 1.4826 * float(np.median(np.abs(phat - centre)))
    sigmas = (float(phat[lag]) - centre) / max(spread, 1e-12)
    energy_x = np.concatenate(([0.0], np.cumsum(x**2)))
    energy_y = np.concatenate(([0.0], np.cumsum(y**2)))
    ex = energy_x[n - lag]  # the overlapping parts at that lag: x[0 : n-lag] and y[lag : n]
    ey = energy_y[n] - energy_y[lag]
    correlation = float(cross[lag] / np.sqrt(max(ex * ey, 1e-20)))
    if sigmas < MIN_PEAK_SIGMAS:
        return {**quiet, "correlation": round(correlation, 3), "peak_sigmas": round(sigmas, 1)}
    gain = cross[lag] / max(ex, 1e-20)  # least squares: y[t] ~ gain * x[t - lag]
    leak_db = 20 * np.log10(max(abs(float(gain)), 1e-10))
    return {
        "flagged": bool(leak_db > FLAG_DB),
        "leak_db": round(float(leak_db), 1),
        "delay_ms": round(lag * 1000.0 / ANALYSIS_RATE, 1),
        "correlation": round(correlation, 3),
        "peak_sigmas": round(sigmas, 1),
    }


def _prepared(track: np.ndarray, rate: int) -> np.ndarray:
    from scipy.signal import resample_poly

    if rate <= 0:
        raise EchoLeakError(f"sample rate must be positive, not {rate}")
    samples = np.asarray(track)
    if samples.ndim != 1:
        raise EchoLeakError(f"a track is one channel; got shape {samples.shape}")
    floats = samples.astype(np.float64) / (32768.0 if samples.dtype.kind in "iu" else 1.0)
    if rate != ANALYSIS_RATE and floats.size:
        g = np.gcd(rate, ANALYSIS_RATE)
        floats = resample_poly(floats, ANALYSIS_RATE // g, rate // g)
    return floats
