"""The callers of bench/serving_e2e.py: real speech, paced as the call page sends it, with its playback acks.

Each caller line runs calls back to back until the run ends; a call's length is drawn from the 3-minute
mix (exponential, mean ``mean_call_s``, capped), so lines hang up and call again as real users do, and
the number of calls in progress stays at the number of lines. A call:

- connects with its own API key, waits for ``session.created``, turns on binary audio both ways
  (``duplex.binary_audio``, as the call page does) and sends pcm16 24 kHz speech as binary frames of 80 ms
  on an absolute schedule (frames overdue after a stall go at once, as a browser's buffered audio would);
  like the call page, it sends no audio while the model prepares (from a ``session.prefill`` not ``done`` until
  one that is, or until the agent's audio comes): those frames are counted as held back, not sent;
- sends ``playback.ack`` every 500 ms with the audio it has "played" (received minus a 120 ms buffer);
- with ``follow_phase``, follows ``session.metrics``' phase advice (``input_shift_ms``, docs/protocol.md): the next
  frame is cut that much longer (more of the speech) or shorter, and the frames after it keep the new phase; the
  call page does not do this yet, so it is off unless asked for;
- notes the engine's period and output rate from ``session.created``, and a unit engine's decision per unit
  (``response.listen`` / ``response.speak``: one per unit, so their arrivals show the unit cadence);
- ends with ``session.close`` and waits for ``session.closed``; a refused call's line backs off (1, 2, 4 ... 16 s,
  with jitter) before it calls again, as "try again later" asks of a client.

Every frame carries its index in its first ``MARK_SAMPLES`` samples (a 0.7 ms mark: 8 samples of +v then 8
of -v; the rest is speech), so with the echo engine each echo is matched to the frame it echoes. The mark
is searched for anywhere in the returned audio: the service's framer cuts engine frames out of a FIFO, so
an echoed frame need not start where a returned chunk does. Per-frame numbers stay in numpy
arrays: the load generator shares the machine it measures.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import numpy as np

FRAME_S = 0.080
RATE = 24000  # the callers' pcm16, as the call page sends it
FRAME_SAMPLES = 1920  # 80 ms at 24 kHz
MARK_SAMPLES = 16
MARK_STEP = 8  # the mark is 8 * (index mod MARK_MOD + 1): survives the echo's float round trip
MARK_MOD = 4000
ACK_EVERY_S = 0.5
PLAYOUT_BUFFER_MS = 120.0
AUDIO_KIND = b"\x01"
RETRY_MAX_S = 16.0  # a refused line waits 1, 2, 4 ... s (times 0.5-1.5) before it calls again
# The service's input counters in session.metrics (cumulative per call): every frame lost, of which quiet
# standing-queue trims and audio discarded while the model prepared; ticks that found no input.
COUNTERS = ("dropped_frames", "trimmed_frames", "prefill_dropped_frames", "underruns")


@dataclass
class CallRecord:
    """One call: when each frame went out and when its echo came back (perf_counter, NaN = never)."""

    line: int
    planned_s: float
    sent: np.ndarray  # per frame index
    echoed: np.ndarray
    audio_frames_in: int = 0  # binary audio frames received (one per tick once live; a unit's whole second)
    audio_samples_in: int = 0
    audio_arrivals: list[float] = field(default_factory=list)
    period_ms: float = 80.0  # the engine's tick (session.created's chunk_period_ms)
    output_rate: int = 24000
    decisions_at: list[float] = field(default_factory=list)  # unit engines: arrival of each unit's decision
    units_spoken: int = 0
    session_id: str = ""
    connected_at: float = 0.0  # the WebSocket opened
    opened_at: float = 0.0  # session.created
    queued: bool = False  # a session.queued came first: the service made the caller wait for admission
    gave_up_queued: bool = False  # still queued when the run ended: hung up (not a failure)
    closed_at: float = 0.0  # session.closed (or the socket's end)
    errors: dict[str, int] = field(default_factory=dict)
    failed: str = ""
    close_reason: str = ""
    last_metrics: dict = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)  # the service's drop counters over the call
    in_wait_ms_max: float = 0.0
    out_wait_ms_max: float = 0.0
    frames_sent: int = 0  # frames due so far (the index after the newest), held back ones included
    frames_held: int = 0  # not sent: due while the model prepared (session.prefill), as the call page holds them
    prefill_noticed_at: float = 0.0  # the first session.prefill (not done) arrived
    tail: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))  # a mark may straddle chunks
    moves: list[tuple[int, float]] = field(default_factory=list)  # (frame cut longer or shorter, by how many s)


class PhaseFollower:
    """A client's side of the phase advice: the next piece's change, taken only from advice measured on audio
    sent after the previous change (``input_shift_from_samples`` at or past where that change ended)."""

    def __init__(self) -> None:
        self.moved_at = 0  # input samples sent on this connection up to the end of the latest changed piece
        self.pending_ms = 0.0

    def on_metrics(self, metrics: dict) -> None:
        shift, since = metrics.get("input_shift_ms"), metrics.get("input_shift_from_samples")
        if shift and since is not None and since >= self.moved_at and not self.pending_ms:
            self.pending_ms = float(shift)

    def take(self, sent_samples: int, frame_samples: int, rate: int) -> int:
        """Samples to add to the next piece (negative: to leave out); ``sent_samples`` before it."""
        extra = round(self.pending_ms * rate / 1000.0)
        extra = max(extra, 1 - frame_samples)  # a piece keeps at least a sample
        if extra:
            self.moved_at, self.pending_ms = sent_samples + frame_samples + extra, 0.0
        return extra


def marked_frames(speech: np.ndarray, frames: int, offset: int) -> list[bytes]:
    """``frames`` binary frames of speech (looped from ``offset``), frame k marked with its index."""
    return [marked_frame(speech, offset, k) for k in range(frames)]


def marked_frame(speech: np.ndarray, offset: int, k: int, extra: int = 0) -> bytes:
    """Frame ``k`` of ``marked_frames``, ``extra`` samples longer (more of the speech that follows it) or shorter."""
    n = len(speech)
    length = FRAME_SAMPLES + extra
    start = (offset + k * FRAME_SAMPLES) % max(1, n - FRAME_SAMPLES - max(0, extra))
    pcm = speech[start : start + length].copy()
    v = MARK_STEP * (k % MARK_MOD + 1)
    pcm[: MARK_SAMPLES // 2] = v
    pcm[MARK_SAMPLES // 2 : MARK_SAMPLES] = -v
    return AUDIO_KIND + pcm.tobytes()


def find_marks(samples: np.ndarray) -> np.ndarray:
    """Frame indices (mod ``MARK_MOD``) of the marks that start in ``samples`` (int32), in order."""
    h = MARK_SAMPLES // 2
    if len(samples) < MARK_SAMPLES:
        return np.zeros(0, dtype=np.int64)
    a = samples[: len(samples) - MARK_SAMPLES + 1]
    cond = a >= MARK_STEP - 1
    for j in (1, h - 1):
        cond &= np.abs(samples[j : j + len(a)] - a) <= 1
    for j in (h, MARK_SAMPLES - 1):
        cond &= np.abs(samples[j : j + len(a)] + a) <= 1
    hits = np.flatnonzero(cond)
    if hits.size == 0:
        return np.zeros(0, dtype=np.int64)
    values = a[hits]
    near = np.abs(values - np.round(values / MARK_STEP) * MARK_STEP) <= 1
    return np.round(values[near] / MARK_STEP).astype(np.int64) - 1


def note_audio(payload: bytes, call: CallRecord, now: float) -> None:
    """An agent audio frame: count it, and with the echo engine match the marks in it to their frames."""
    samples = np.frombuffer(payload, dtype="<i2").astype(np.int32)
    call.audio_frames_in += 1
    call.audio_samples_in += samples.size
    call.audio_arrivals.append(now)
    joined = np.concatenate([call.tail, samples]) if call.tail.size else samples
    call.tail = joined[-(MARK_SAMPLES - 1) :]
    sent_so_far = call.frames_sent
    for m in find_marks(joined):
        if not 0 <= m < MARK_MOD:
            continue
        # the newest frame sent with that mark (indices repeat every MARK_MOD frames, 320 s)
        k = m + max(0, (sent_so_far - 1 - m) // MARK_MOD) * MARK_MOD
        if k < len(call.echoed) and np.isnan(call.echoed[k]) and not np.isnan(call.sent[k]):
            call.echoed[k] = now


async def one_call(
    url: str,
    key: str,
    call: CallRecord,
    speech: np.ndarray,
    rng: random.Random,
    until: float = float("inf"),
    follow_phase: bool = False,
) -> None:
    """One call; a caller still queued at ``until`` (perf_counter, the run's end) hangs up, and one admitted late
    sends no frame due after it (a queue wait must not stretch the run)."""
    from websockets.asyncio.client import connect

    frames = max(1, int(call.planned_s / FRAME_S))
    offset = rng.randrange(len(speech))
    payloads = marked_frames(speech, frames, offset)
    follower = PhaseFollower() if follow_phase else None
    closed = asyncio.Event()
    preparing = False  # between a session.prefill not done and the model's readiness: the uplink is held
    try:
        async with connect(
            url, additional_headers={"Authorization": f"Bearer {key}"}, max_size=2**22, open_timeout=60
        ) as ws:
            call.connected_at = time.perf_counter()
            while True:
                try:
                    raw = await asyncio.wait_for(ws.recv(), min(60.0, max(0.1, until - time.perf_counter())))
                except TimeoutError:
                    if call.queued and time.perf_counter() >= until:
                        call.gave_up_queued = True
                        call.closed_at = time.perf_counter()
                        return
                    raise
                event = json.loads(raw)
                if event["type"] == "session.queued":
                    call.queued = True
                if event["type"] == "session.created":
                    call.session_id = event["session"]["id"]
                    caps = (event["session"].get("duplex") or {}).get("capabilities") or {}
                    call.period_ms = float(caps.get("chunk_period_ms") or call.period_ms)
                    call.output_rate = int(caps.get("output_rate") or call.output_rate)
                    call.opened_at = time.perf_counter()
                    break
                if event["type"] == "error":  # refused: the code, and the message that says by what
                    call.failed = f"{event['error']['code']}: {event['error'].get('message', '')}"[:200]
                    return
            fmt = {"type": "audio/pcm", "rate": RATE}
            update = {"audio": {"input": {"format": fmt}}, "duplex": {"binary_audio": True}}
            await ws.send(json.dumps({"type": "session.update", "session": update}))

            async def receive() -> None:
                nonlocal preparing
                async for message in ws:
                    now = time.perf_counter()
                    if isinstance(message, bytes):
                        if message[:1] == AUDIO_KIND:
                            preparing = False  # the agent's audio means the prefill is over (as the call page)
                            note_audio(message[1:], call, now)
                        continue
                    event = json.loads(message)
                    kind = event["type"]
                    if kind == "session.prefill":
                        preparing = not event.get("done")
                        call.prefill_noticed_at = call.prefill_noticed_at or (now if preparing else 0.0)
                    elif kind == "session.metrics":
                        values = event.get("metrics") or {}
                        call.last_metrics = values
                        for name in COUNTERS:  # the slot's, cumulative
                            call.counters[name] = max(call.counters.get(name, 0), int(values.get(name, 0)))
                        call.in_wait_ms_max = max(call.in_wait_ms_max, float(values.get("in_wait_ms_max", 0.0)))
                        call.out_wait_ms_max = max(call.out_wait_ms_max, float(values.get("out_wait_ms_max", 0.0)))
                        if follower is not None:
                            follower.on_metrics(values)
                    elif kind in ("response.listen", "response.speak"):
                        call.decisions_at.append(now)
                        call.units_spoken += kind == "response.speak"
                    elif kind == "error":
                        code = event["error"]["code"]
                        call.errors[code] = call.errors.get(code, 0) + 1
                    elif kind == "session.closed":
                        call.close_reason = event.get("reason", "")
                        closed.set()

            receiver = asyncio.create_task(receive())
            loop = asyncio.get_running_loop()
            start = loop.time() + 0.02
            frames = min(frames, max(0, int((until - time.perf_counter()) / FRAME_S)))  # admitted late: to the end
            next_ack = start + ACK_EVERY_S
            sent_samples = 0
            for k in range(frames):
                payload = payloads[k]
                extra = follower.take(sent_samples, FRAME_SAMPLES, RATE) if follower and not preparing else 0
                if extra:  # this frame is cut that much later (or earlier): it and every later one move
                    start += extra / RATE
                    call.moves.append((k, extra / RATE))
                    payload = marked_frame(speech, offset, k, extra)
                due = start + k * FRAME_S
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                call.frames_sent = k + 1
                if preparing:
                    call.frames_held += 1
                else:
                    call.sent[k] = time.perf_counter()
                    await ws.send(payload)
                    sent_samples += (len(payload) - 1) // 2
                if loop.time() >= next_ack:
                    next_ack += ACK_EVERY_S
                    received_ms = call.audio_samples_in * 1000.0 / call.output_rate
                    played = max(0.0, received_ms - PLAYOUT_BUFFER_MS)
                    await ws.send(json.dumps({"type": "playback.ack", "played_ms": played}))
            await asyncio.sleep(8 * FRAME_S)  # the last echoes are still in flight
            await ws.send(json.dumps({"type": "session.close"}))
            try:
                await asyncio.wait_for(closed.wait(), 15)
            except TimeoutError:
                call.failed = call.failed or "no session.closed within 15 s"
            call.closed_at = time.perf_counter()
            receiver.cancel()
    except Exception as exc:  # noqa: BLE001 - a failed call is reported, the others go on
        call.failed = call.failed or f"{type(exc).__name__}: {exc}"[:200]
        call.closed_at = call.closed_at or time.perf_counter()


async def caller_line(
    line: int,
    url: str,
    key: str,
    start_after_s: float,
    until: float,
    mean_call_s: float,
    max_call_s: float,
    speech: np.ndarray,
    calls: list[CallRecord],
    seed: int,
    follow_phase: bool = False,
) -> None:
    """Calls back to back from ``start_after_s`` until ``until`` (perf_counter), lengths from the mix."""
    rng = random.Random(seed)
    await asyncio.sleep(start_after_s)
    refused_in_a_row = 0
    while (left := until - time.perf_counter()) > 2.0:
        planned = min(rng.expovariate(1.0 / mean_call_s), max_call_s, left)
        planned = max(planned, 1.0)
        frames = max(1, int(planned / FRAME_S))
        call = CallRecord(line, planned, np.full(frames, np.nan), np.full(frames, np.nan))
        calls.append(call)
        await one_call(url, key, call, speech, rng, until, follow_phase)
        refused_in_a_row = refused_in_a_row + 1 if call.failed else 0
        if call.failed:  # tries again later, backing off as a client should ("try again later"), with jitter
            await asyncio.sleep(min(RETRY_MAX_S, 2.0 ** (refused_in_a_row - 1)) * rng.uniform(0.5, 1.5))
