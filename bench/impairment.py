"""Calls over an impaired network, WebSocket against WebRTC, in one run: mouth-to-ear, underruns, audible gaps.

One daphne (``webapp.settings.local``, echo engine returning the caller's audio on the next tick) serves
every call. Each call goes through a user-space relay (``impair_relay.py``: 50 +/- 20 ms each way, then
2 % and 5 % loss each way); WebRTC's ICE is forced through it (the offer goes without candidates and the
answer's are replaced by the relay's address, so the only path is the relay). The callers are Python:
an aiortc peer connection (Opus both ways, the ``oai-events`` channel) and a WebSocket client (pcm16 in
20 ms binary frames up, the server's binary frames down). Both send the same signal in real time: a
300 Hz tone with a 40 ms 2 kHz marker every second and a 200 ms pause before the next (a signal with no
pause at all would keep any backlog in the server's input queue for good: its trims wait for quiet).

What a listener hears is modelled the same way for both: the received audio goes through one playout
buffer of 20 ms frames with an adaptive target (40 ms at first, +20 ms at each underrun, at most 200 ms,
re-primed to the target after an underrun); a WebRTC packet that never came plays as silence where it
belonged. Mouth-to-ear is from a marker leaving the caller to its echo's playout (network both ways,
server, playout buffer; no sound card at either end). An audible gap is a stretch of the played
audio quieter than the tone (10 ms windows below RMS 0.02): lost packets, underruns and anything the
server dropped alike.

    .venv/bin/python bench/impairment.py --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy import signal as sps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.impair_relay import Impairment, TcpRelay, UdpRelay  # noqa: E402
from bench.latency_browser import USERNAME, server_env, start_server  # noqa: E402
from bench.results_io import write_result  # noqa: E402
from bench.stats import summary  # noqa: E402

RATE = 24_000
FRAME = 480  # 20 ms
MARKER_EVERY = 24_000  # samples (1 s): a marker, the tone to 800 ms, then 200 ms of quiet (a pause, as speech has)
TONE_END = 19_200
MARKER_LEN = 960  # 40 ms
CONDITIONS = {  # label -> (delay ms, jitter ms, loss per packet and direction)
    "clean": (0, 0, 0.0),
    "delay50j20": (50, 20, 0.0),
    "delay50j20-loss2": (50, 20, 0.02),
    "delay50j20-loss5": (50, 20, 0.05),
}


def conditions_of(labels: list[str]) -> dict[str, dict[str, float]]:
    """The conditions a run went through, as its result records them."""
    return {label: dict(zip(("delay_ms", "jitter_ms", "loss"), CONDITIONS[label], strict=True)) for label in labels}


GAP_RMS = 0.02
MAKE_KEY = (
    "from django.contrib.auth import get_user_model; from webapp.accounts.services import apikey_create; "
    f"print(apikey_create(user=get_user_model().objects.get(username={USERNAME!r}), name='bench')[1])"
)


def caller_signal(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    out = 0.15 * np.sin(2 * np.pi * 300 * t) * ((np.arange(len(t)) % MARKER_EVERY) < TONE_END)
    for start in range(0, len(out), MARKER_EVERY):
        out[start : start + MARKER_LEN] += 0.4 * np.sin(2 * np.pi * 2000 * t[: len(out[start : start + MARKER_LEN])])
    return out.astype(np.float32)


# ---- the two callers ------------------------------------------------------------------------------------


async def websocket_call(port: int, key: str, sig: np.ndarray, seconds: float) -> dict:
    import websockets

    pcm = (np.clip(sig, -1, 1) * 32767).astype("<i2")
    heard: list[tuple[float, np.ndarray, None]] = []
    sent_at: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    async with websockets.connect(url, additional_headers=headers, open_timeout=60, max_size=None) as ws:
        while json.loads(await ws.recv())["type"] != "session.created":
            pass
        update = {"type": "session.update", "session": {"type": "realtime", "duplex": {"binary_audio": True}}}
        await ws.send(json.dumps(update))

        async def receive():
            async for message in ws:
                if isinstance(message, bytes) and message[:1] == b"\x01":
                    heard.append((time.monotonic(), np.frombuffer(message[1:], "<i2").astype(np.float32) / 32767, None))

        receiver = asyncio.create_task(receive())
        start = time.monotonic()
        for k in range(int(seconds * RATE) // FRAME):
            await asyncio.sleep(max(0.0, start + k * FRAME / RATE - time.monotonic()))
            sent_at.append(time.monotonic())
            await ws.send(b"\x01" + pcm[(k * FRAME) % len(pcm) :][:FRAME].tobytes())
        await asyncio.sleep(1.0)
        await ws.send(json.dumps({"type": "session.close"}))
        await asyncio.sleep(0.3)
        receiver.cancel()
    return {"heard": heard, "sent_at": sent_at}


def through_relay(sdp: str, relay_host: str, relay_port: int, *, required: bool = True) -> tuple[str, tuple[str, int]]:
    """``sdp`` with its candidates replaced by one at the relay; and its first IPv4 UDP candidate's address (None
    when it has none and not ``required``: a browser's offer may carry none, or only mDNS names)."""
    first, lines = None, []
    for line in sdp.split("\r\n"):
        if line.startswith("a=candidate:"):
            parts = line.split()
            if first is None and parts[2].lower() == "udp" and ":" not in parts[4]:
                first = (parts[4], int(parts[5]))
            continue
        lines.append(line)
        if line.startswith("m="):
            lines.append(f"a=candidate:1 1 udp 2130706431 {relay_host} {relay_port} typ host")
    if first is None and required:
        raise SystemExit("the SDP has no IPv4 UDP candidate")
    return "\r\n".join(lines), first


async def webrtc_call(port: int, key: str, sig: np.ndarray, seconds: float, relay: UdpRelay, host: str) -> dict:
    from tests.webapp.webrtc.rtc_client import ArrayMicrophone, rtc_answer, rtc_offer

    mic = ArrayMicrophone(sig)
    caller, offer = await rtc_offer(mic)
    front_port, back_port = await relay.start(host)
    offer, relay.client = through_relay(offer, host, back_port)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/realtime/calls",
        data=offer.encode(),
        headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {key}"},
    )
    answer = await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=60).read().decode())
    answer, relay.upstream = through_relay(answer, host, front_port)
    await rtc_answer(caller, answer)
    await caller.until("session.created", wait_s=20)
    caller.send({"type": "session.update", "session": {"type": "realtime"}})
    await caller.until("session.updated", wait_s=10)
    await asyncio.sleep(seconds + 1.0)
    caller.send({"type": "session.close"})
    await asyncio.sleep(0.3)
    await caller.close()
    relay.close()
    heard = [(at, pcm, pts) for (at, pcm), pts in zip(caller.heard, caller.heard_pts, strict=True)]
    return {"heard": heard, "sent_at": mic.sent_at}


# ---- what a listener hears ------------------------------------------------------------------------------


def received_frames(heard: list) -> tuple[np.ndarray, np.ndarray, int]:
    """20 ms frames in stream order with the time each was complete; a WebRTC gap in media time (packets that
    never came) becomes silent frames due with the next arrival. Returns (frames, due, lost frames)."""
    samples, due, lost = [], [], 0
    expected = None
    for arrival, pcm, media_s in heard:
        if media_s is not None and expected is not None and media_s - expected > 0.005:
            missing = int(round((media_s - expected) * RATE))
            lost += missing // FRAME
            samples.append(np.zeros(missing, np.float32))
            due.append(np.full(missing, arrival))
        if media_s is not None:
            expected = media_s + len(pcm) / RATE
        samples.append(pcm)
        due.append(np.full(len(pcm), arrival))
    stream, ready = np.concatenate(samples), np.concatenate(due)
    n = len(stream) // FRAME
    return stream[: n * FRAME].reshape(n, FRAME), ready[FRAME - 1 : n * FRAME : FRAME], lost


def playout(frames: np.ndarray, ready: np.ndarray) -> tuple[np.ndarray, float, dict]:
    """Play the frames on a 20 ms clock through the adaptive buffer; returns (output audio, its start time, stats)."""
    target, clock = 0.040, ready[0] + 0.040
    start = clock
    out = np.zeros(int((ready[-1] - start + 5) * RATE) + len(frames) * FRAME, np.float32)
    underruns, depths = 0, []
    for i in range(len(frames)):
        if ready[i] > clock:  # the frame is not there when it is due: silence until it comes, then re-prime
            underruns += 1
            target = min(0.200, target + 0.020)
            clock = ready[i] + target
        depths.append(clock - ready[i])
        at = int(round((clock - start) * RATE))
        out[at : at + FRAME] = frames[i]
        clock += FRAME / RATE
    return out[: int(round((clock - start) * RATE))], start, {"underruns": underruns, "final_target_ms": target * 1000}


def mouth_to_ear(out: np.ndarray, start: float, sent_at: list[float]) -> list[float]:
    sos = sps.butter(4, [1700, 2300], btype="bandpass", fs=RATE, output="sos")
    band = np.abs(sps.sosfilt(sos, out))
    hop = 120  # 5 ms
    envelope = band[: len(band) // hop * hop].reshape(-1, hop).mean(axis=1)
    if not len(envelope):
        return []
    threshold = 0.5 * np.percentile(envelope, 99)
    delays, last = [], -1e9
    # markers of the first 2 s left out: the call's start (session.update, the first ticks) is not the network
    marker_sent = [sent_at[k] for k in range(0, len(sent_at), MARKER_EVERY // FRAME)]
    first_kept = sent_at[0] + 2.0 if sent_at else 0.0
    for w in np.flatnonzero((envelope[1:] >= threshold) & (envelope[:-1] < threshold)) + 1:
        heard_at = start + w * hop / RATE
        if heard_at - last < 0.3:
            continue
        last = heard_at
        earlier = [s for s in marker_sent if 0 < heard_at - s < 1.0]
        if earlier and max(earlier) >= first_kept:
            delays.append((heard_at - max(earlier)) * 1000)
    return delays


def gaps(out: np.ndarray, start: float, sent_at: list[float], delay_ms: float) -> list[float]:
    """Silent stretches (ms) of the played audio where the caller's signal, ``delay_ms`` earlier, was sound
    throughout (50 ms either side), from 2 s into the call to 1 s before its end."""
    window = 240
    rms = np.sqrt((out[: len(out) // window * window].reshape(-1, window) ** 2).mean(axis=1))
    runs, run = [], 0
    for w in range(len(rms)):
        source_n = (start + w * window / RATE - delay_ms / 1000 - sent_at[0]) * RATE
        phases = (source_n + np.array([-1200, 0, 1200 + window])) % MARKER_EVERY
        expected = source_n > 2 * RATE and source_n < len(sent_at) * FRAME - RATE and bool(np.all(phases < TONE_END))
        if expected and rms[w] < GAP_RMS:
            run += 1
        elif run:
            runs.append(run * 10.0)
            run = 0
    return runs + ([run * 10.0] if run else [])


def analyse(call: dict) -> dict:
    frames, ready, lost = received_frames(call["heard"])
    out, start, play = playout(frames, ready)
    delays = mouth_to_ear(out, start, call["sent_at"])
    silent = gaps(out, start, call["sent_at"], float(np.median(delays)) if delays else 0.0)
    return {
        "mouth_to_ear_ms": summary(delays, (50, 95), digits=1),
        "markers": {"sent_after_2s": len(call["sent_at"]) // (MARKER_EVERY // FRAME) - 2, "heard": len(delays)},
        "underruns": play["underruns"],
        "playout_target_ms_at_end": round(play["final_target_ms"]),
        "lost_frames_at_client": lost,
        "gaps": {
            "count": len(silent),
            "total_ms": round(sum(silent)),
            "over_100ms": sum(1 for g in silent if g > 100),
            "max_ms": max(silent, default=0.0),
        },
        "played_s": round(len(out) / RATE, 1),
    }


def keep_call(trace: Path | None, label: str, transport: str, call: dict) -> None:
    """With ``--trace``: the caller's side of the call (send and arrival times on the server trace's clock)."""
    if trace is None:
        return
    record = {
        "k": "call",
        "label": label,
        "transport": transport,
        "sent_at": call["sent_at"],
        "heard": [(at, len(pcm), pts, round(float(np.abs(pcm).max(initial=0)), 3)) for at, pcm, pts in call["heard"]],
    }
    with open(trace.with_suffix(".calls.jsonl"), "a") as out:
        out.write(json.dumps(record) + "\n")


async def run_condition(label: str, port: int, key: str, seconds: float, host: str, trace: Path | None) -> dict:
    delay, jitter, loss = CONDITIONS[label]
    sig = caller_signal(seconds)
    results = {}
    udp = UdpRelay(Impairment(delay, jitter, loss, seed=2))
    call = await webrtc_call(port, key, sig, seconds, udp, host)
    keep_call(trace, label, "webrtc", call)
    results["webrtc"] = {**analyse(call), "relay": vars(udp.counts)}
    await asyncio.sleep(1.5)  # the session's slot is free again
    tcp = TcpRelay(Impairment(delay, jitter, loss, seed=1), ("127.0.0.1", port))
    relay_port = await tcp.start()
    call = await websocket_call(relay_port, key, sig, seconds)
    tcp.close()
    keep_call(trace, label, "websocket", call)
    results["websocket"] = {**analyse(call), "relay": vars(tcp.counts)}
    await asyncio.sleep(1.5)
    return results


def host_address() -> str:
    """An address the server's ICE gathers on (aioice leaves out 127.0.0.1)."""
    from aioice.ice import get_host_addresses

    return get_host_addresses(use_ipv4=True, use_ipv6=False)[0]


async def main_async(args, port: int, key: str) -> dict:
    host = host_address()
    # Warm-up, not kept: the first call of a fresh server loads the engine.
    await websocket_call(port, key, caller_signal(3), 3)
    await asyncio.sleep(1.5)
    return {label: await run_condition(label, port, key, args.seconds, host, args.trace) for label in args.conditions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    parser.add_argument("--out", default=None, help="a folder for the result instead of bench/results")
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="record the server's audio path here (bench/trace_daphne.py) and each call's caller side next to it",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = server_env(SimpleNamespace(engine="echo", warm_start="off", jitter_ms=0, trace=args.trace), Path(tmp))
        # Not recorded: post-processing runs eagerly in the web process (make run's default) and would hold the
        # thread the next call's database lookups wait on.
        env["PARLEY_RECORD"] = "off"
        proc, url = start_server(env)
        try:
            made = subprocess.run(
                [sys.executable, "manage.py", "shell", "-c", MAKE_KEY],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            key = made.stdout.strip().splitlines()[-1]
            port = int(url.rsplit(":", 1)[1])
            load_before = os.getloadavg()[0]
            results = asyncio.run(main_async(args, port, key))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    result = {
        "bench": "impairment",
        "seconds_per_call": args.seconds,
        "conditions": conditions_of(args.conditions),
        "host": {
            "cpus": os.cpu_count(),
            "load_avg_1m_before": round(load_before, 2),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
        },
        "results": results,
    }
    path = write_result(result, "impairment-echo", out=args.out)
    for label, by_transport in results.items():
        for transport, r in by_transport.items():
            m = r["mouth_to_ear_ms"]
            print(
                f"{label:18} {transport:9} m2e p50 {m.get('p50')} p95 {m.get('p95')} max {m.get('max')}  "
                f"underruns {r['underruns']}  gaps>100ms {r['gaps']['over_100ms']} max gap {r['gaps']['max_ms']}  "
                f"markers {r['markers']['heard']}/{r['markers']['sent_after_2s']}"
            )
    print(path)


if __name__ == "__main__":
    main()
