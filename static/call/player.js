// Adaptive jitter buffer for the agent's voice: 24 kHz pcm16 chunks scheduled back to back.
//
// Every chunk is scheduled at the end of the previous one. What is still queued when a chunk
// arrives (its slack) measures the network and server jitter the buffer absorbed: the buffer
// starts low (`startMs`), grows on an underrun by what was missing plus a step, and shrinks slowly
// once the smallest slack over a window of arrivals shows more margin than it needs, by playing
// chunks slightly fast (not by cutting audio): 2 % for a little spare, up to 8 % for a lot (after a
// stall, the late audio arrives in a burst and would otherwise stay on as latency for long). A
// backlog of more than `maxMs` beyond the target (the tab was throttled, a stalled connection
// flushed at once) is an overrun and dropped, so latency cannot creep.
//
// The audio clock can also lose time against the wall: a starved audio thread (a loaded machine, and
// more often with a small output buffer, latencyHint 0) renders late, so the context's clock falls
// behind while the server goes on sending 80 ms per 80 ms of wall time. Whatever arrives meanwhile is
// queued on the stalled clock and stays as extra delay; the microphone audio of that time never
// existed, so the server padded the gap with silence. The player measures that slip (wall time minus
// context time since the first chunk) and drops as much from the front of the next chunks at once,
// never below the target: traced on a loaded 2-core machine, each slip otherwise added its length to
// the delay until the 2-8 % give-back removed it, seconds later (bench/notes/latency.md).

function pushBounded(list, value, limit) {
  list.push(value);
  if (list.length > limit) list.shift();
}

/** The page's pcm16 rate on /v1/realtime, both ways (the mic worklet produces it too). */
export const WIRE_RATE = 24000;

const GROW_STEP_MS = 20; // added on top of what an underrun was missing: one miss should not repeat
// Slack kept above the worst arrival of a window. With 10 ms, a quiet loopback echo call still had
// 2-3 underruns per 30-60 s (arrivals a little later than any of the previous window's); with 25 ms
// none in two 60 s calls, for about 15 ms more latency. With latencyHint 0 (stop 24), 25 ms left one
// underrun in each of two quiet 60 s calls, missing by 3-8 ms; 30 ms: 1 in three (bench/notes/latency.md).
const MARGIN_MS = 30;
const WINDOW_ARRIVALS = 25; // 2 s of 80 ms chunks: long enough to see the jitter's tail
const MIN_SPEEDUP = 0.02; // 1.6 ms less per 80 ms chunk: inaudible
const MAX_SPEEDUP = 0.08; // 6.4 ms less per chunk: about a semitone, and only while far behind
// Audio-clock slip dropped at once beyond this: above the jitter of reading the two clocks on the main thread
// (the context's clock moves in render callbacks, ~10 ms apart with the "interactive" hint).
const SLIP_MS = 15;
const SLIP_READINGS = 4; // chunk arrivals (about 320 ms) whose smallest reading is taken as the slip

export class JitterPlayer {
  /**
   * @param {AudioContext} ctx
   * @param {{rate?: number, startMs?: number, minMs?: number, maxTargetMs?: number, maxMs?: number,
   *          onAck?: (playedMs: number) => void, onStart?: (chunk: ScheduledChunk) => void, dropSlip?: boolean,
   *          marginMs?: number}} options
   *   onStart is called with each chunk's schedule: {at (context time it starts), duration (s), samples}.
   */
  constructor(
    ctx,
    {
      rate = WIRE_RATE,
      startMs = 40,
      minMs = 10,
      maxTargetMs = 600,
      maxMs = 1000,
      onAck = null,
      onStart = null,
      dropSlip = true,
      marginMs = MARGIN_MS,
    } = {},
  ) {
    this.ctx = ctx;
    this.rate = rate;
    this.targetMs = startMs; // the jitter allowance: how far ahead of now the first chunk after a gap starts
    this.minMs = minMs;
    this.maxTargetMs = maxTargetMs;
    this.maxMs = maxMs;
    this.onAck = onAck;
    this.onStart = onStart;
    this.dropSlip = dropSlip; // drop what arrives for time the audio clock lost (see the top of this file)
    this.marginMs = marginMs;
    this.gain = ctx.createGain();
    this.analyser = ctx.createAnalyser(); // the output waveform view reads from here
    this.analyser.fftSize = 2048;
    this.gain.connect(this.analyser).connect(ctx.destination);
    this.cursor = 0; // context time at which the next chunk starts
    this.primed = false; // false until the first chunk after start/reset is scheduled
    this.live = new Set(); // sources scheduled and not yet ended, so flush() can stop them
    this.slacks = []; // slack (ms) of the arrivals in the current window
    this.shrinkMs = 0; // buffer still to give back by playing fast
    this.clockOrigin = null; // [performance.now(), context ms] at the first chunk: the slip is measured from there
    this.slipDroppedMs = 0; // audio dropped for the audio clock's slip so far (ms)
    this.lags = []; // the latest readings of (wall - context) time since clockOrigin (ms)
    this.stats = {
      chunksScheduled: 0,
      underruns: 0,
      overruns: 0,
      grows: 0,
      shrinks: 0,
      playedMs: 0,
      playedSumSquares: 0,
      playedSamples: 0,
      recentPlayedRms: 0,
      slipDroppedMs: 0,
    };
    this.lastAckMs = 0;
  }

  /** Buffered audio not yet played, in ms. */
  get depthMs() {
    return Math.max(0, (this.cursor - this.ctx.currentTime) * 1000);
  }

  /** RMS of everything actually played so far (0 before any). */
  get playedRms() {
    const { playedSumSquares, playedSamples } = this.stats;
    return playedSamples ? Math.sqrt(playedSumSquares / playedSamples) : 0;
  }

  /** Schedule one chunk of little-endian int16 samples at `this.rate`; returns its start (context time). */
  push(int16) {
    if (int16.length === 0) return null;
    const now = this.ctx.currentTime;
    const skip = this.primed && this.dropSlip ? this.slipToDrop(now, int16.length) : 0;
    if (skip >= int16.length) return null; // the whole chunk arrived for time the audio clock lost
    const samples = new Float32Array(int16.length - skip);
    let sumSquares = 0;
    for (let i = 0; i < samples.length; i++) {
      samples[i] = int16[skip + i] / 32768;
      sumSquares += samples[i] * samples[i];
    }
    if (!this.primed) {
      this.cursor = now + this.targetMs / 1000;
      this.primed = true;
      this.clockOrigin = [performance.now(), now * 1000];
      this.slipDroppedMs = 0;
      this.lags = [];
    } else if (this.cursor < now) {
      // The buffer ran dry (the listener heard a gap): allow for at least that much jitter from now on.
      this.stats.underruns++;
      this.grow((now - this.cursor) * 1000 + GROW_STEP_MS);
      this.cursor = now + this.targetMs / 1000;
    } else if (this.cursor - now > (this.targetMs + this.maxMs) / 1000) {
      this.stats.overruns++; // drop the backlog so latency returns to the target
      this.flush();
      this.primed = true;
      this.cursor = now + this.targetMs / 1000;
    } else {
      this.observe((this.cursor - now) * 1000);
    }
    const buffer = this.ctx.createBuffer(1, samples.length, this.rate);
    buffer.copyToChannel(samples, 0);
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    let duration = buffer.duration;
    if (this.shrinkMs > 0) {
      const rate = 1 + Math.min(MAX_SPEEDUP, Math.max(MIN_SPEEDUP, this.shrinkMs / 2000));
      source.playbackRate.value = rate;
      duration /= rate;
      this.shrinkMs -= (buffer.duration - duration) * 1000;
    }
    source.connect(this.gain);
    source.onended = () => this.ended(source, samples.length, sumSquares);
    const at = this.cursor;
    source.start(at);
    this.cursor += duration;
    this.live.add(source);
    this.stats.chunksScheduled++;
    this.onStart?.({ at, duration, samples: samples.length });
    return at;
  }

  /**
   * Samples to drop from the front of a chunk of `length` for the audio clock's slip: how far the
   * context's clock has fallen behind the wall since the first chunk, less what was dropped for it
   * already, once beyond SLIP_MS; never more than the queue holds above the target.
   */
  slipToDrop(now, length) {
    if (this.ctx.state !== "running" || this.clockOrigin === null) return 0; // a suspended clock is not a slip
    const [wall0, context0] = this.clockOrigin;
    // The context's time moves in render callbacks, so one reading is late by up to a callback: the
    // smallest of the last few is the slip.
    pushBounded(this.lags, performance.now() - wall0 - (now * 1000 - context0), SLIP_READINGS);
    const slipMs = Math.min(...this.lags) - this.slipDroppedMs;
    if (slipMs < -SLIP_MS) this.slipDroppedMs += slipMs; // the audio clock ran ahead (drift): re-baseline
    if (slipMs <= SLIP_MS) return 0;
    const spareMs = (this.cursor - now) * 1000 - this.targetMs;
    const dropMs = Math.min(slipMs, spareMs);
    if (dropMs <= 0) return 0;
    const samples = Math.min(length, Math.round((dropMs / 1000) * this.rate));
    const droppedMs = (samples / this.rate) * 1000;
    this.slipDroppedMs += droppedMs;
    this.stats.slipDroppedMs += droppedMs;
    return samples;
  }

  grow(ms) {
    this.targetMs = Math.min(this.maxTargetMs, this.targetMs + ms);
    this.stats.grows++;
    this.slacks = [];
    this.shrinkMs = 0;
  }

  /**
   * One arrival's slack; at the end of a window, give back what the worst arrival did not need.
   *
   * The spare is the queue's own standing depth, not just the target's: a burst (audio held up by
   * the network, then delivered at once) queues far beyond the target, and capping the give-back
   * at the target left that backlog standing as latency for the rest of the call (measured: the
   * buffer stayed at 300 ms with a 10 ms target after 10 s of 0-200 ms jitter).
   */
  observe(slackMs) {
    this.slacks.push(slackMs);
    if (this.slacks.length < WINDOW_ARRIVALS) return;
    const spare = Math.min(...this.slacks) - this.marginMs;
    this.slacks = [];
    if (spare > 1) {
      this.targetMs = Math.max(this.minMs, this.targetMs - spare);
      this.shrinkMs = spare; // what the rest of the window still shows; not added to the previous one
      this.stats.shrinks++;
    }
  }

  ended(source, length, sumSquares) {
    this.live.delete(source);
    if (source.flushed) return; // stopped early: it was not (fully) heard
    const s = this.stats;
    s.playedMs += (length / this.rate) * 1000;
    s.playedSumSquares += sumSquares;
    s.playedSamples += length;
    s.recentPlayedRms = Math.sqrt(sumSquares / length);
    // Ack about twice a second: enough for the server's latency estimate, cheap on the wire.
    if (this.onAck && s.playedMs - this.lastAckMs >= 500) {
      this.lastAckMs = s.playedMs;
      this.onAck(s.playedMs);
    }
  }

  /** Stop everything scheduled (pause, stop, barge-in); the next chunk primes again. */
  flush() {
    for (const source of this.live) {
      source.flushed = true;
      source.stop();
    }
    this.live.clear();
    this.primed = false;
    this.slacks = [];
    this.shrinkMs = 0;
    this.cursor = this.ctx.currentTime;
  }
}
