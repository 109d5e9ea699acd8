"""Mouth-to-ear latency measured in a real browser (Debian chromium, headless, fake microphone).

The fake microphone plays a chirp every 500 ms; the call page (``?tap=1``) records what enters its
audio graph from the microphone and what it sends to the destination; cross-correlation gives each
chirp's delay (``tests/browser/latency_probe.py`` says exactly what is and is not included). With the
echo engine at zero delay, that delay is the stack's own latency: capture, resampling, framing, the
WebSocket both ways, the wait for the tick, the jitter buffer and the output.

With a model engine (``--engine lockstep``: the tiny random PersonaPlex demo checkpoint of
``make run``) the agent's voice is not the caller's, so chirps cannot be matched; the page's own
per-chunk measurement (``window.parley.mouthToEarMs``, where the page has one) is reported instead,
with the time to first agent audio.

Usage (loopback; one chromium, one call)::

    .venv/bin/python bench/latency_browser.py --seconds 60
    .venv/bin/python bench/latency_browser.py --engine lockstep
    .venv/bin/python bench/latency_browser.py --jitter-ms 200 --jitter-seconds 30 --label jitter

Starts daphne on 127.0.0.1 (free port) with ``webapp.settings.local`` in a temporary var dir (its own
SQLite DB and user), then chromium through Playwright. Prints a summary and writes
``bench/results/latency-<engine>[-<label>]-<cores>core-<commit>.json``. The 1-minute load average before and
after is recorded: this is a timing benchmark, and a busy machine shows up in the tail.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_io import commit, write_result  # noqa: E402
from bench.stats import summary  # noqa: E402
from tests.browser.latency_probe import AudioStalls, MeasuredCall, run_measured_call, write_marked_wav  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
USERNAME, PASSWORD = "latency", "latency-bench-password"
MAX_SECONDS = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(args, var_dir: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
        "PARLEY_VAR_DIR": str(var_dir),
        "PARLEY_SLOTS": "1",
        "PARLEY_QUEUE_MAX": "0",
        "PARLEY_ECHO_DELAY_FRAMES": "0",
        # auto: the engine loads and the default persona and voice are prefilled as the server starts
        "PARLEY_WARM_START": args.warm_start,
    }
    if args.engine == "echo":
        env |= {"PARLEY_ENGINE": "echo", "PARLEY_CHECKPOINT": ""}
    else:
        checkpoint = var_dir / "tiny-personaplex"
        subprocess.run(
            [sys.executable, "-m", "inference", "make-checkpoint", "--preset", "tiny-personaplex"]
            + ["--out", str(checkpoint), "--seed", "0"],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        env |= {"PARLEY_ENGINE": "personaplex", "PARLEY_CHECKPOINT": str(checkpoint)}
    if args.jitter_ms:
        env |= {
            "PARLEY_TEST_OUTPUT_JITTER_MS": str(args.jitter_ms),
            "PARLEY_TEST_OUTPUT_JITTER_S": str(args.jitter_seconds),
        }
    if args.trace:
        env["PARLEY_TRACE_PATH"] = str(args.trace.resolve())
    for name in ("PARLEY_INFERENCE_URL", "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    return env


CREATE_USER = (
    "from django.contrib.auth import get_user_model; U = get_user_model(); "
    f"U.objects.filter(username={USERNAME!r}).exists() or U.objects.create_user({USERNAME!r}, password={PASSWORD!r})"
)


def start_server(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", CREATE_USER], cwd=ROOT, env=env, check=True)
    port = free_port()
    daphne = [str(Path(sys.executable).with_name("daphne"))]
    if env.get("PARLEY_TRACE_PATH"):  # --trace: the same daphne with the audio path's queues recorded
        daphne = [sys.executable, "-m", "bench.trace_daphne"]
    proc = subprocess.Popen(
        [*daphne, "-b", "127.0.0.1", "-p", str(port), "webapp.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"daphne exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("daphne did not start listening in time")


class LoadSampler:
    """The 1-minute load average every 2 s while the call runs: a busy machine shows up in the tail."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            self.values.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        v = self.values or [os.getloadavg()[0]]
        return {"min": round(min(v), 2), "mean": round(sum(v) / len(v), 2), "max": round(max(v), 2)}


def warm_call(page) -> float | None:
    """A first call until its first agent audio, then stop: a model engine's prefill cache then holds this
    persona and voice, and the measured call shows the instant start. Returns this call's first audio (ms)."""
    page.click("#start")
    page.wait_for_function("() => window.parley.audioChunksReceived > 0 && window.parley.firstAudioMs !== null")
    first = page.evaluate("() => window.parley.firstAudioMs")
    page.click("#stop")
    page.wait_for_function("() => window.parley.state === 'closed'", timeout=30_000)
    return first


def launch_chromium(pw, wav: Path):
    """Headless Debian chromium whose fake microphone plays ``wav``, media allowed without a prompt."""
    return pw.chromium.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=[
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}",
            "--autoplay-policy=no-user-gesture-required",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
        ],
    )


def run_call(args, url: str, wav: Path) -> tuple[MeasuredCall, float | None, dict]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch_chromium(pw, wav)
        try:
            page = browser.new_page()
            page.set_default_timeout(180_000)  # a model engine warms up on the first request
            page.goto(f"{url}/accounts/login/")
            page.fill("input[name=username]", USERNAME)
            page.fill("input[name=password]", PASSWORD)
            page.click("form [type=submit]")
            page.wait_for_url(lambda u: "/accounts/login/" not in u)
            call_page = f"{url}/?raw=1&tap=1&transport=websocket{'&' + args.query if args.query else ''}"
            page.goto(call_page)
            opened = time.monotonic()
            # with a warm start the page is 'warming' (Start disabled) until the server is ready
            page.wait_for_function("() => window.parley && window.parley.state === 'idle'")
            ready = {
                "warm_start_seen_by_page": page.evaluate("() => window.parley.warmStart"),  # off, ready, failed
                "page_ready_wait_ms": rounded((time.monotonic() - opened) * 1000),  # page opened -> Start enabled
            }
            cold = None
            if args.engine == "lockstep":
                cold = warm_call(page)
                page.goto(call_page)
                page.wait_for_function("() => window.parley && window.parley.state === 'idle'")
            return run_measured_call(page, args.seconds), cold, ready
        finally:
            browser.close()


def percentiles(values: list[float]) -> dict[str, float]:
    return summary(values, (50, 95), digits=1, count=None)


def stages(call: MeasuredCall, chunk_ms: float) -> dict[str, dict[str, float]]:
    """Where each measured tick's mouth-to-ear went (the page's parts, latency.js), p50 / p95 per stage.

    ``buffer`` (receipt -> the end of the chunk playing) holds the chunk itself: a sound at a frame's start
    waits for the frame to fill, inherent to the engine's frame; the rest is the jitter buffer's wait.
    """
    parts = [s["parts"] for s in call.samples if s.get("parts")]
    rows = {
        "capture (piece fill + page until sent)": [p["capture"] for p in parts],
        "round trip (socket up, server FIFO + tick, socket down)": [p["roundTrip"] for p in parts],
        "jitter buffer wait": [p["buffer"] - chunk_ms for p in parts],
        f"frame (inherent, {chunk_ms:g} ms chunk)": [chunk_ms for _ in parts],
        "output (the context's reported latency)": [p["output"] for p in parts],
        "sum (the page's measured mouth-to-ear)": [
            p["capture"] + p["roundTrip"] + p["buffer"] + p["output"] for p in parts
        ],
    }
    return {name: percentiles(values) for name, values in rows.items()}


def rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 1)


def by_10s(samples: list[dict], key: str) -> dict[str, dict[str, float]]:
    buckets: dict[int, list[float]] = {}
    for s in samples:
        if s.get(key) is not None:
            buckets.setdefault(int(s["t_s"] // 10) * 10, []).append(s[key])
    return {f"{k}-{k + 10}s": percentiles(v) for k, v in sorted(buckets.items())}


def summarize(
    args, call: MeasuredCall, load: dict, server_cpu_s: float, cold_first_audio: float | None, ready: dict
) -> dict:
    final = call.final
    chunk_ms = float((final.get("capabilities") or {}).get("chunk_period_ms") or 80)
    result: dict = {
        "bench": "latency_browser",
        "label": args.label,
        "note": args.note,
        "engine": args.engine,
        "seconds": args.seconds,
        "echo_delay_frames": 0,
        "warm_start": args.warm_start,
        **ready,
        "injected_jitter": {"max_ms": args.jitter_ms, "first_seconds": args.jitter_seconds} if args.jitter_ms else None,
        "git": commit(),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {
            "cpus": os.cpu_count(),
            "load_avg_1m_before": round(load["before"], 2),
            "load_avg_1m_during": load["during"],
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
            "server_cpu_seconds": round(server_cpu_s, 2),  # daphne + inference service, the whole run
            "python": platform.python_version(),
            "chromium": subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout.strip(),
        },
        "context_rate": call.tap.rate,
        "tap_skipped_frames": call.tap.skipped,  # render quanta a starved audio thread never ran
        "tap_overlapped_frames": call.tap.overlapped,  # context frames rendered twice (the repeat left out)
        "page": {
            "underruns": final.get("underruns"),
            "overruns": final.get("overruns"),
            "played_ms": round(final.get("playedMs") or 0),
            "first_audio_ms": rounded(final.get("firstAudioMs")),  # Start -> first agent audio at the speaker
            "first_audio_ms_first_call": rounded(
                cold_first_audio
            ),  # lockstep: the call before, which filled the prefill cache
            "start_timeline_ms": final.get("startTimeline"),  # where the first audio's time went (hooks.js)
            "buffer_ms": percentiles([s["bufferMs"] for s in call.samples if s.get("bufferMs") is not None]),
            "measured_mouth_to_ear_ms": percentiles([s["measuredMs"] for s in call.samples if s.get("measuredMs")]),
            "shown_mouth_to_ear_ms": percentiles([s["shownMs"] for s in call.samples if s.get("shownMs")]),
        },
        "stages_ms": stages(call, chunk_ms),
        "page_by_10s": {
            "buffer_ms": by_10s(call.samples, "bufferMs"),
            "underruns_at_end_of": {f"{int(s['t_s'])}s": s["underruns"] for s in call.samples[9::10]},
        },
        "server_metrics_at_end": final.get("metrics"),
        "wire": call.wire.summary() if call.wire else None,
        "measured_parts_ms": {
            part: percentiles([s["parts"][part] for s in call.samples if s.get("parts")])
            for part in ("capture", "roundTrip", "buffer", "output")
        },
    }
    if args.engine == "echo":
        marks = call.marks()
        result["mouth_to_ear"] = marks.summary()
        # Over time, in 10 s buckets: shows a jitter phase and the recovery after it.
        buckets: dict[int, list[float]] = {}
        for t, d in zip(marks.mark_times_s, marks.delays_ms, strict=True):
            buckets.setdefault(int(t // 10) * 10, []).append(d)
        result["mouth_to_ear_by_10s"] = {f"{k}-{k + 10}s": percentiles(v) for k, v in sorted(buckets.items())}
        result["delays_ms"] = [round(d, 1) for d in marks.delays_ms]
        # for bench/latency_trace.py: each mark's time on the page's audio clock, and the page per second
        if args.trace:
            result["mark_times_s"] = [round(t, 3) for t in marks.mark_times_s]
    if args.trace:
        result["trace"] = {
            "server": str(args.trace),
            "tap_start_frame": call.tap.start_frame,
            "page_samples": [{k: v for k, v in s.items() if k != "parts"} for s in call.samples],
        }
    return result


def stage_table(result: dict) -> str:
    """The per-stage evidence as a small table, with the chirps' own figure and the load beside it."""
    host = result["host"]
    lines = [
        f"{result['engine']} '{result['label']}': load average (1 min) {host['load_avg_1m_before']} before, "
        f"{host['load_avg_1m_during']} during, on {host['cpus']} CPUs",
        f"{'stage (ms)':58s} {'p50':>7s} {'p95':>7s}",
    ]
    for name, row in result["stages_ms"].items():
        lines.append(f"{name:58s} {row.get('p50', float('nan')):7.1f} {row.get('p95', float('nan')):7.1f}")
    marks = result.get("mouth_to_ear")
    if marks and marks.get("marks"):
        lines.append(
            f"{'chirps, cross-correlated (' + str(marks['marks']) + ' marks)':58s} {marks['p50_ms']:7.1f} {marks['p95_ms']:7.1f}"
        )
    page, server = result["page"], result["server_metrics_at_end"] or {}
    lines.append(
        f"underruns {page['underruns']}, first audio {page['first_audio_ms']} ms; server: tick p50/p99 "
        f"{server.get('tick_ms_p50')}/{server.get('tick_ms_p99')} ms, FIFO wait max {server.get('in_wait_ms_max')} ms, "
        f"outbox wait max {server.get('out_wait_ms_max')} ms"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["echo", "lockstep"], default="echo")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--label", default="", help="the configuration, in the result's name (e.g. jitter)")
    parser.add_argument("--jitter-ms", type=int, default=0, help="inject random 0..N ms delays on outgoing audio")
    parser.add_argument("--jitter-seconds", type=float, default=30.0, help="... during the first N s of the call")
    parser.add_argument("--note", default="", help="recorded in the results, e.g. what was measured and the load")
    parser.add_argument("--query", default="", help="extra call page parameters, e.g. for an experiment")
    parser.add_argument(
        "--warm-start",
        choices=["auto", "off"],
        default="off",
        help="PARLEY_WARM_START: auto prepares the engine and the default start while the server starts",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--stall-audio-ms", type=float, default=0, help="test-only: stop chromium's audio service this long ..."
    )
    parser.add_argument("--stall-every-s", type=float, default=10.0, help="... every N s (a starved audio thread)")
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="record the server's FIFO and outbox (bench/trace_daphne.py) here, JSONL",
    )
    parser.add_argument("--dump", type=Path, default=None, help="also save the tapped signals (npz), to look at")
    args = parser.parse_args(argv)
    if not 1 <= args.seconds <= MAX_SECONDS:
        parser.error(f"--seconds must be within 1..{MAX_SECONDS}")
    if not Path(CHROMIUM).exists():
        parser.error(f"chromium not found at {CHROMIUM} (apt-get install chromium, or set CHROMIUM)")
    var_dir = Path(tempfile.mkdtemp(prefix="parley-latency-"))
    load = {"before": os.getloadavg()[0]}
    proc = None
    try:
        wav = write_marked_wav(var_dir / "marks.wav")
        proc, url = start_server(server_env(args, var_dir))
        with LoadSampler() as sampler, AudioStalls(args.stall_audio_ms, args.stall_every_s) as stalls:
            call, cold, ready = run_call(args, url, wav)
        load["during"] = sampler.summary()
        cpu = psutil.Process(proc.pid).cpu_times()
        result = summarize(args, call, load, cpu.user + cpu.system, cold, ready)
        if args.stall_audio_ms:
            result["audio_stalls"] = {
                "ms": args.stall_audio_ms,
                "every_s": args.stall_every_s,
                "monotonic_s": stalls.times,
            }
        if args.dump:
            mic, out_signal = call.tap.signals()
            np.savez_compressed(args.dump, mic=mic, out=out_signal, rate=call.tap.rate)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # a busy engine thread can hold a clean exit up
                proc.kill()
                proc.wait()
        shutil.rmtree(var_dir, ignore_errors=True)
    out = write_result(result, "-".join(filter(None, ["latency", args.engine, args.label])), out=args.out)
    shown = {k: v for k, v in result.items() if k not in ("delays_ms", "stages_ms")}
    print(json.dumps(shown, indent=2))
    print(stage_table(result))
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
