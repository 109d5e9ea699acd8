"""The call page's audio modules in a real chromium, without Django: the mic worklet's
resampling and pieces, and the adaptive jitter buffer.

The modules are served from ``static/`` by a plain HTTP server on 127.0.0.1 (a secure context,
which AudioWorklet and getUserMedia require). The worklet test launches its own chromium whose
fake microphone plays a known sine, so frequency and level after resampling can be checked.
"""

from __future__ import annotations

import functools
import math
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

STATIC = Path(__file__).resolve().parents[2] / "static"
HARNESS = "<!doctype html><meta charset=utf-8><title>audio harness</title>"


class _Handler(SimpleHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        if self.path == "/harness.html":
            body = HARNESS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass


@pytest.fixture(scope="module")
def static_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(STATIC)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def sine_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 s of a 1 kHz sine at amplitude 0.5, 48 kHz mono: RMS 0.354."""
    path = tmp_path_factory.mktemp("sine") / "sine_1k.wav"
    subprocess.run(
        ["sox", "-n", "-r", "48000", "-c", "1", "-b", "16", str(path), "synth", "10", "sine", "1000", "vol", "0.5"],
        check=True,
        timeout=60,
    )
    return path


CAPTURE_FRAMES_JS = """
async (count) => {
  const ctx = new AudioContext();
  await ctx.resume();
  await ctx.audioWorklet.addModule("/call/mic-worklet.js");
  const stream = await navigator.mediaDevices.getUserMedia({audio: {
    echoCancellation: false, noiseSuppression: false, autoGainControl: false, channelCount: 1}});
  const node = new AudioWorkletNode(ctx, "parley-mic", {numberOfInputs: 1, numberOfOutputs: 0});
  const frames = [];
  await new Promise((resolve) => {
    node.port.onmessage = ({data}) => {
      frames.push({samples: Array.from(data.frame), rms: data.rms, time: data.time, now: ctx.currentTime});
      if (frames.length === count) resolve();
    };
    ctx.createMediaStreamSource(stream).connect(node);
  });
  stream.getTracks().forEach((t) => t.stop());
  await ctx.close();
  return {contextRate: ctx.sampleRate, frames};
}
"""


def test_mic_worklet_resamples_to_24k_pieces_of_20_ms(launch_with_fake_mic, static_server, sine_wav):
    page = launch_with_fake_mic(sine_wav).new_page()
    page.goto(f"{static_server}/harness.html")
    result = page.evaluate(CAPTURE_FRAMES_JS, 80)

    assert result["contextRate"] != 24000, "the test must exercise resampling"
    frames = result["frames"]
    assert all(len(f["samples"]) == 480 for f in frames)
    # Each piece says when its last sample entered the graph: 20 ms apart, never in the future.
    times = [f["time"] for f in frames]
    assert all(f["time"] <= f["now"] + 0.01 for f in frames)
    assert (times[-1] - times[0]) / (len(times) - 1) == pytest.approx(0.020, rel=0.02)
    # Skip the first pieces: the fake device and the interpolator start from silence.
    steady = [s for f in frames[20:] for s in f["samples"]]
    rms = math.sqrt(sum(s * s for s in steady) / len(steady))
    assert rms == pytest.approx(0.5 / math.sqrt(2), rel=0.05)
    # Every piece at the tone's level: a resampler error at piece boundaries would put most pieces off. A few may
    # be off when the fake capture itself skipped on a loaded machine: clean-clone suite runs on the 2-core
    # machine failed here with 1 and then 2 of the 60 pieces at rms 0.25 (half the piece missing), after the
    # checks above had passed; reruns passed. Up to 3 of 60 (5 %) are taken as the capture's, not ours.
    off = [(i, round(f["rms"], 3)) for i, f in enumerate(frames[20:], 20) if f["rms"] != pytest.approx(0.354, rel=0.05)]
    assert len(off) <= 3, f"pieces off the tone's level (index, rms): {off}"
    # A wrong resampling ratio would shift the tone: count upward zero crossings at 24 kHz.
    crossings = sum(1 for a, b in zip(steady, steady[1:], strict=False) if a < 0 <= b)
    frequency = crossings / (len(steady) / 24000)
    assert frequency == pytest.approx(1000, rel=0.02)


PLAYER_JS = """
async () => {
  const {JitterPlayer} = await import("/call/player.js");
  const {base64ToInt16, decodeAudioFrame, encodeAudioFrame} = await import("/call/audio-wire.js");
  const ctx = new AudioContext();
  await ctx.resume();
  const acks = [];
  const scheduled = [];
  // dropSlip off: on a loaded machine the audio clock falls behind the wall, and the player would drop that
  // slip from the chunks (by design; test_latency covers it), so the schedule below would not be back to back
  // (a clean-clone run on the 2-core machine: 769 of the 800 ms, 31 ms dropped for the clock's slip).
  const player = await JitterPlayer.create(ctx, {
    startMs: 100, maxMs: 1100, dropSlip: false, onAck: (ms) => acks.push(ms),
    onStart: (chunk) => scheduled.push(chunk)});
  const sine = (n) => Float32Array.from({length: n}, (_, i) => 0.5 * Math.sin(2 * Math.PI * 440 * i / 24000));
  const chunk = () => decodeAudioFrame(encodeAudioFrame(sine(1920)));
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const until = async (check) => { for (let i = 0; i < 200 && !(await check()); i++) await sleep(20); };

  // 10 chunks of 80 ms pushed at once: they play back to back, no underrun.
  for (let i = 0; i < 10; i++) player.push(chunk());
  await until(() => scheduled.length === 10);
  const first = scheduled[0], last = scheduled[9];
  const depthAfterPush = (last.at + last.duration - first.at) * 1000;
  const firstWaitMs = (first.at - first.receivedAt) * 1000;  // both on the audio thread's clock
  const ends = scheduled.map((c) => c.end);
  await until(async () => (await player.figures()).stats.playedMs >= 800);
  const figures = await player.figures();
  const afterSteady = {...figures.stats, playedRms: player.playedRms, acks: [...acks]};

  // The queue has run dry; the next chunk is an underrun.
  await sleep(200);
  player.push(chunk());
  const afterGap = await player.figures();

  // 2 s at once is more than the target + maxMs: the backlog is dropped, latency returns to the target.
  player.flush();
  for (let i = 0; i < 25; i++) player.push(chunk());
  const overrunFigures = await player.figures();
  const overrun = {overruns: overrunFigures.stats.overruns, depthMs: overrunFigures.depthMs};
  player.flush();
  const flushed = await player.figures();
  player.close();
  await ctx.close();

  const frame = encodeAudioFrame(Float32Array.from([0, 0.5, -0.5, 1, -1, 2]));
  const wire = {
    bytes: Array.from(new Uint8Array(frame)),
    roundTrip: Array.from(decodeAudioFrame(frame)),
    otherKind: decodeAudioFrame(Uint8Array.of(2, 0, 0).buffer),
    fromBase64: Array.from(base64ToInt16(new Uint8Array(frame.slice(1)).toBase64())),
  };
  return {depthAfterPush, firstWaitMs, ends, afterSteady, underrunsAfterGap: afterGap.stats.underruns,
          targetAfterGap: afterGap.targetMs, overrun, flushedDepth: flushed.depthMs, wire};
}
"""


def test_jitter_player_counts_playback_underruns_and_overruns(page, static_server):
    page.goto(f"{static_server}/harness.html")
    r = page.evaluate(PLAYER_JS)

    # Ten 80 ms chunks were scheduled back to back, the first the 100 ms start allowance after it arrived.
    assert r["depthAfterPush"] == pytest.approx(800, abs=1)
    assert r["firstWaitMs"] == pytest.approx(100, abs=0.1)
    assert r["ends"] == [1920 * (i + 1) for i in range(10)]  # where each chunk ends among the samples received
    steady = r["afterSteady"]
    assert steady["chunksScheduled"] == 10
    assert steady["playedMs"] == pytest.approx(800, abs=1)
    assert steady["underruns"] == 0 and steady["overruns"] == 0
    assert steady["playedRms"] == pytest.approx(0.5 / math.sqrt(2), rel=0.01)
    assert steady["acks"] and steady["acks"][0] >= 500  # acknowledged about twice a second
    assert r["underrunsAfterGap"] == 1
    assert r["targetAfterGap"] >= 100 + 200  # it grew by at least the gap the listener heard
    assert r["overrun"]["overruns"] >= 1
    assert r["overrun"]["depthMs"] <= 1100 + 2 * r["targetAfterGap"]
    assert r["flushedDepth"] == 0
    # Binary audio frames: kind byte 0x01, then pcm16 clamped to [-1, 1], little-endian; base64 decodes the same.
    wire = r["wire"]
    assert wire["bytes"][:5] == [0x01, 0, 0, 0xFF, 0x3F]  # 0, then 16383 little-endian
    assert wire["roundTrip"] == [0, 16383, -16384, 32767, -32768, 32767]
    assert wire["fromBase64"] == wire["roundTrip"]
    assert wire["otherKind"] is None


ADAPT_JS = """
async () => {
  const {JitterPlayer} = await import("/call/player.js");
  const ctx = new AudioContext();
  await ctx.resume();
  const player = await JitterPlayer.create(ctx, {startMs: 60});
  const chunk = () => new Int16Array(1920).fill(1000);
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  // Chunks arrive on the context clock every 80 ms, like a server tick; `stallAt` arrives 250 ms late.
  const t0 = ctx.currentTime;
  let k = 0;
  const feed = async (until, stallAt = -1) => {
    for (; k < until; k++) {
      const due = t0 + k * 0.08 + (k === stallAt ? 0.25 : 0);
      while (ctx.currentTime < due) await sleep(2);
      player.push(chunk());
    }
  };
  const figures = async () => {
    const f = await player.figures();
    return {target: f.targetMs, underruns: f.stats.underruns, shrinks: f.stats.shrinks, depth: f.depthMs};
  };
  const initial = await figures();
  await feed(10);
  const start = await figures();
  await feed(12, 11);
  const stalled = await figures();
  await feed(12 + 120);  // 9.6 s without a stall: about three windows
  const calm = await figures();
  // A burst: 400 ms of held-up audio at once (not an overrun), then steady arrivals again.
  for (let i = 0; i < 5; i++) player.push(chunk());
  const burstDepth = (await figures()).depth;
  await feed(132 + 100);  // 8 s
  const afterBurst = await figures();
  player.close();
  await ctx.close();
  return {initial, start, stalled, calm, burstDepth, afterBurst};
}
"""


@pytest.mark.solo  # its start target grew past 60 ms beside another browser file: the page's own feeding ran late
def test_jitter_player_starts_low_grows_on_underrun_and_shrinks_when_calm(page, static_server):
    page.goto(f"{static_server}/harness.html")
    r = page.evaluate(ADAPT_JS)
    assert r["initial"]["target"] == 60  # it starts low
    # and stays there while chunks come on time; on a slow host this page's own feeding can run late, and then
    # the buffer grows for that real underrun (82 ms seen on a clean-clone CI run), never without one
    assert r["start"]["target"] == 60 or r["start"]["underruns"] > 0, r
    # one chunk 250 ms late against a 60 ms buffer: an underrun, and the buffer grows past the miss
    assert r["stalled"]["underruns"] > r["start"]["underruns"]
    assert r["stalled"]["target"] >= r["start"]["target"] + 150
    # steady arrivals afterwards: the buffer is given back, slowly
    assert r["calm"]["shrinks"] >= 1
    assert r["calm"]["target"] < r["stalled"]["target"] - 50
    # a burst's backlog is given back too (by playing fast), not kept as latency once arrivals are steady: the
    # depth returns to where it stood before the burst (the calm depth itself is the margin plus this page's
    # own feeding jitter: 142-152 ms measured, with the main-thread player of 5426bf7 as with the worklet)
    assert r["burstDepth"] >= r["calm"]["depth"] + 350
    assert r["afterBurst"]["depth"] <= r["calm"]["depth"] + 25, r
    assert r["afterBurst"]["underruns"] == r["calm"]["underruns"]
