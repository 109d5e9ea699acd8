"""True mouth-to-ear latency in a real browser: marked sounds in, the page's own output tapped, matched.

Used by ``tests/browser/test_latency.py`` and ``bench/latency_browser.py``.

- ``write_marked_wav`` makes the fake microphone's file: a short chirp every ``MARK_PERIOD_S``,
  cycling through four sweeps (up and down, in a low and a high band), silence between them.
- The call page, opened with ``?tap=1``, records two signals in one AudioWorklet, sample-aligned on
  the AudioContext clock: what the microphone delivers into the audio graph and what the page sends
  to the graph's destination (``static/call/tap-worklet.js``). ``TapReader`` drains them.
- ``match_marks`` finds each chirp on the microphone side by normalised cross-correlation, then the
  same chirp on the output side within ``MAX_DELAY_S``; the distance is that mark's delay.

Mouth is the moment a mark enters the page's audio graph; ear is the moment it reaches the
destination, plus the output latency the AudioContext reports (``baseLatency + outputLatency``).
The fake capture device's own path (file -> renderer) happens before the page can see anything and
is not included. A mark is only matched against its own sweep, and the next mark of that sweep is
``4 * MARK_PERIOD_S`` later, so a delay up to ``MAX_DELAY_S`` is never mistaken for a shorter one.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

MARK_PERIOD_S = 0.5
MARK_S = 0.03
MAX_DELAY_S = 1.9
SWEEPS = ((500.0, 1700.0), (1700.0, 500.0), (1700.0, 3400.0), (3400.0, 1700.0))  # (from, to) Hz, in turn
MARK_AMPLITUDE = 0.5
MIC_MATCH = 0.8  # normalised correlation a mark must reach on the (clean) microphone side
OUT_MATCH = 0.5  # ... and on the output side, after two resamplings and pcm16 on the wire
FILE_SECONDS = 10  # the fake microphone loops the file; 20 marks keep the four sweeps in turn across the loop


def chirp(rate: int, sweep: int) -> np.ndarray:
    """One Hann-windowed linear sweep (``SWEEPS[sweep]``) of ``MARK_S`` at ``rate``."""
    n = int(round(MARK_S * rate))
    t = np.arange(n) / rate
    f0, f1 = SWEEPS[sweep]
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * MARK_S))
    return (np.sin(phase) * np.hanning(n)).astype(np.float64)


def write_marked_wav(path: Path, rate: int = 48_000) -> Path:
    """``FILE_SECONDS`` of 16-bit mono: a chirp at every multiple of ``MARK_PERIOD_S``, the sweeps in turn."""
    samples = np.zeros(FILE_SECONDS * rate)
    marks = int(round(FILE_SECONDS / MARK_PERIOD_S))
    for i in range(marks):
        start = int(round(i * MARK_PERIOD_S * rate))
        sweep = chirp(rate, i % len(SWEEPS)) * MARK_AMPLITUDE
        samples[start : start + len(sweep)] = sweep
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return path


# ---- reading the page's tap -----------------------------------------------------------------------

DRAIN_JS = "() => window.parleyTap ? window.parleyTap.drain() : null"


@dataclass
class TapReader:
    """Collects the tap's two signals from the page, drained in pieces while the call runs."""

    rate: int = 0
    start_frame: int | None = None
    output_latency_s: float = 0.0
    mic: list[np.ndarray] = field(default_factory=list)
    out: list[np.ndarray] = field(default_factory=list)
    frames: int = 0
    skipped: int = 0  # frames the audio thread never rendered (filled with silence)
    overlapped: int = 0  # frames the audio thread rendered twice (the repeat is left out)

    def drain(self, page: Any) -> None:
        data = page.evaluate(DRAIN_JS)
        if data is None:
            raise AssertionError("the page has no latency tap: open the call page with ?tap=1")
        self.rate = int(data["rate"])
        self.output_latency_s = float(data["outputLatency"])
        if not data["frames"]:
            return
        if self.start_frame is None:
            self.start_frame = int(data["start"])
        mic, out = _int16(data["mic"]), _int16(data["out"])
        at = 0
        for start, length in data.get("blocks") or [[data["start"], len(mic)]]:
            block_mic, block_out = mic[at : at + length], out[at : at + length]
            at += length
            gap = int(start) - (self.start_frame + self.frames)
            if gap < 0:  # the audio thread rendered these context frames twice: keep the first rendering
                repeat = min(-gap, len(block_mic))
                self.overlapped += repeat
                block_mic, block_out = block_mic[repeat:], block_out[repeat:]
            elif gap:  # a starved audio thread skipped render quanta: keep both signals on the context clock
                self.skipped += gap
                self.mic.append(np.zeros(gap))
                self.out.append(np.zeros(gap))
                self.frames += gap
            self.mic.append(block_mic)
            self.out.append(block_out)
            self.frames += len(block_mic)

    def signals(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate(self.mic or [np.zeros(0)]), np.concatenate(self.out or [np.zeros(0)])


def _int16(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<i2").astype(np.float64) / 32768.0


# ---- matching ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Marks:
    """The outcome of one call: each found mark's delay (ms), in order, and the marks that never came back."""

    delays_ms: list[float]
    mark_times_s: list[float]  # when each matched mark entered the graph, seconds from the tap's start
    missing: int
    output_latency_ms: float

    @property
    def found(self) -> int:
        return len(self.delays_ms)

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.delays_ms, q)) if self.delays_ms else float("nan")

    def summary(self) -> dict[str, float | int]:
        d = np.asarray(self.delays_ms)
        if not len(d):
            return {"marks": 0, "missing": self.missing}
        return {
            "marks": len(d),
            "missing": self.missing,
            "p50_ms": round(float(np.percentile(d, 50)), 1),
            "p95_ms": round(float(np.percentile(d, 95)), 1),
            "max_ms": round(float(d.max()), 1),
            "min_ms": round(float(d.min()), 1),
            "mean_ms": round(float(d.mean()), 1),
            "output_latency_ms_included": round(self.output_latency_ms, 1),
        }


def normalised_xcorr(signal: np.ndarray, template: np.ndarray) -> np.ndarray:
    """ncc[i] = <signal[i:i+m], template> / (|signal[i:i+m]| |template|), for every full window i."""
    m = len(template)
    if len(signal) < m:
        return np.zeros(0)
    size = 1 << int(np.ceil(np.log2(len(signal) + m)))
    corr = np.fft.irfft(np.fft.rfft(signal, size) * np.conj(np.fft.rfft(template, size)), size)[: len(signal) - m + 1]
    energy = np.concatenate([[0.0], np.cumsum(signal * signal)])
    window = np.sqrt(np.maximum(energy[m:] - energy[:-m], 0.0))
    return corr / (window * np.linalg.norm(template) + 1e-9)


def find_marks(mic: np.ndarray, rate: int) -> list[tuple[int, int]]:
    """Every chirp on the microphone side: (sample index, which sweep), in time order."""
    scores = np.stack([normalised_xcorr(mic, chirp(rate, k)) for k in range(len(SWEEPS))])
    if scores.shape[1] == 0:
        return []
    best = scores.max(axis=0)
    min_gap = int(MARK_PERIOD_S * rate / 2)
    candidates = np.flatnonzero(best > MIC_MATCH)
    marks: list[tuple[int, int]] = []
    i = 0
    while i < len(candidates):
        # one cluster of above-threshold samples is one mark: take its peak
        j = i
        while j + 1 < len(candidates) and candidates[j + 1] - candidates[j] < min_gap:
            j += 1
        cluster = candidates[i : j + 1]
        peak = int(cluster[np.argmax(best[cluster])])
        marks.append((peak, int(np.argmax(scores[:, peak]))))
        i = j + 1
    return marks


def match_marks(mic: np.ndarray, out: np.ndarray, rate: int, output_latency_s: float = 0.0) -> Marks:
    """Each microphone mark's delay to its copy in the output (plus the reported output latency)."""
    templates = [chirp(rate, k) for k in range(len(SWEEPS))]
    span = int(MAX_DELAY_S * rate)
    delays: list[float] = []
    times: list[float] = []
    missing = 0
    for index, sweep in find_marks(mic, rate):
        template = templates[sweep]
        window = out[index : index + span + len(template)]
        if len(window) < span + len(template):
            continue  # too close to the end of the recording to judge
        ncc = normalised_xcorr(window, template)
        lag = int(np.argmax(ncc))
        if ncc[lag] < OUT_MATCH:
            missing += 1
            continue
        delays.append(1000.0 * (lag / rate + output_latency_s))
        times.append(index / rate)
    return Marks(delays, times, missing, 1000.0 * output_latency_s)


# ---- driving one measured call -------------------------------------------------------------------

SAMPLE_JS = """() => {
  const p = window.parley;
  return {bufferMs: p.bufferMs, underruns: p.underruns, jitter: p.jitter, overruns: p.overruns, playedMs: p.playedMs,
          state: p.state, measuredMs: p.mouthToEarMs ?? null, firstAudioMs: p.firstAudioMs ?? null, parts: p.latencyParts ?? null,
          framesSent: p.framesSent, audioMsReceived: p.audioMsReceived, audioClock: p.audioClock,
          shownMs: parseFloat(document.querySelector("[data-figure=mouth_to_ear]")?.textContent) || null};
}"""


AUDIO_EVENTS = ('"input_audio_buffer.append"', '"response.output_audio.delta"')
WIRE_RATE = 24_000  # pcm16 both ways on the call page


@dataclass
class WireCounter:
    """Bytes of the call page's audio on its /v1/realtime socket, both ways, as the browser framed them.

    Counts every WebSocket message the page sent and received (Playwright's frame events): binary
    audio frames (``0x01`` + pcm16) and JSON audio events (base64 pcm16) are audio; the rest is
    control. ``header`` adds the WebSocket frame header (2-14 bytes, a 4-byte mask from the client).
    """

    up: dict[str, float] = field(
        default_factory=lambda: dict(messages=0, binary=0, bytes=0, header=0, audio_s=0.0, other=0)
    )
    down: dict[str, float] = field(
        default_factory=lambda: dict(messages=0, binary=0, bytes=0, header=0, audio_s=0.0, other=0)
    )

    def attach(self, page: Any) -> None:
        def on_socket(ws: Any) -> None:
            if "/v1/realtime" in ws.url:
                ws.on("framesent", lambda payload: self._count(self.up, payload, masked=True))
                ws.on("framereceived", lambda payload: self._count(self.down, payload, masked=False))

        page.on("websocket", on_socket)

    @staticmethod
    def _count(side: dict[str, float], payload: str | bytes, *, masked: bool) -> None:
        size = len(payload.encode() if isinstance(payload, str) else payload)
        header = (2 if size < 126 else 4 if size < 65536 else 10) + (4 if masked else 0)
        samples = None
        if isinstance(payload, bytes):
            if payload[:1] == b"\x01":
                samples = (size - 1) // 2
        elif any(kind in payload[:80] for kind in AUDIO_EVENTS):
            event = json.loads(payload)
            samples = len(base64.b64decode(event.get("audio") or event.get("delta") or "")) // 2
        if samples is None:
            side["other"] += size + header
            return
        side["messages"] += 1
        side["binary"] += isinstance(payload, bytes)
        side["bytes"] += size
        side["header"] += header
        side["audio_s"] += samples / WIRE_RATE

    def summary(self) -> dict[str, dict[str, float]]:
        """Per direction: audio messages, seconds, payload bytes per second of audio (and with headers)."""
        out = {}
        for name, side in (("up", self.up), ("down", self.down)):
            seconds = side["audio_s"]
            out[name] = {
                "audio_messages": int(side["messages"]),
                "binary_audio_messages": int(side["binary"]),
                "audio_seconds": round(seconds, 2),
                "payload_bytes_per_audio_s": round(side["bytes"] / seconds) if seconds else None,
                "wire_bytes_per_audio_s": round((side["bytes"] + side["header"]) / seconds) if seconds else None,
                "other_bytes": int(side["other"]),
            }
        return out


@dataclass
class MeasuredCall:
    """One call's tap recording and the page's own figures, sampled once a second."""

    tap: TapReader
    samples: list[dict[str, Any]]
    final: dict[str, Any]
    wire: WireCounter | None = None

    def marks(self) -> Marks:
        mic, out = self.tap.signals()
        return match_marks(mic, out, self.tap.rate, self.tap.output_latency_s)


def run_measured_call(
    page: Any, seconds: float, *, live_timeout_ms: int = 90_000, must_close: bool = True
) -> MeasuredCall:
    """On an open call page (``?raw=1&tap=1``): press Start, keep the call live ``seconds``, stop.

    Drains the tap every second (so no single transfer is large) and samples the page's figures. A call that has
    not closed 20 s after Stop fails, unless not ``must_close`` (a bench on a lossy network): then the page's
    state 20 s after Stop is kept in ``final["state_after_stop"]``.
    """
    wire = WireCounter()
    wire.attach(page)
    page.click("#start")
    # live and talking: a model engine goes live, then prefills its persona, then speaks
    page.wait_for_function(
        "() => window.parley.state === 'live' && window.parley.audioChunksReceived > 0", timeout=live_timeout_ms
    )
    tap = TapReader()
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        page.wait_for_timeout(1000)
        tap.drain(page)
        sample = page.evaluate(SAMPLE_JS)
        sample["t_s"] = round(time.monotonic() - started, 2)
        sample["monotonic_s"] = time.monotonic()  # the server's trace (bench/trace_daphne.py) uses the same clock
        sample["context_frames"] = (tap.start_frame or 0) + tap.frames  # the page's audio clock at this drain
        samples.append(sample)
        if sample["state"] != "live":
            raise AssertionError(f"the call left the live state after {sample['t_s']} s: {sample['state']}")
    tap.drain(page)
    final = page.evaluate("() => JSON.parse(JSON.stringify(window.parley))")
    page.click("#stop")
    try:
        page.wait_for_function("() => window.parley.state === 'closed'", timeout=20_000)
    except Exception:  # noqa: BLE001 - Playwright's TimeoutError; the bench keeps what it measured
        if must_close:
            raise
    final["state_after_stop"] = page.evaluate("() => window.parley.state")
    return MeasuredCall(tap, samples, final, wire)


class AudioStalls:
    """Test-only: stop chromium's audio service process for ``ms`` every ``every_s`` seconds (SIGSTOP, SIGCONT).

    A starved audio thread on a loaded machine, made reproducible: while the audio service is stopped
    the page's AudioContext renders nothing, so its clock falls behind the wall, the fake microphone's
    audio of that time is lost, and the server's audio arriving meanwhile queues on the stalled clock
    (bench/notes/latency.md, 6942395). Linux only (SIGSTOP).. Only the audio service of a chromium this process started.
    """

    def __init__(self, ms: float, every_s: float) -> None:
        self.ms, self.every_s = ms, every_s
        self.times: list[float] = []  # monotonic start of each stall
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _audio_service() -> psutil.Process | None:
        for child in psutil.Process().children(recursive=True):
            try:
                if any("audio.mojom.AudioService" in arg for arg in child.cmdline()):
                    return child
            except psutil.Error:
                continue
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            service = self._audio_service()
            if service is None:
                continue
            self.times.append(time.monotonic())
            service.suspend()
            try:
                time.sleep(self.ms / 1000)
            finally:
                service.resume()

    def __enter__(self) -> AudioStalls:
        if self.ms > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
