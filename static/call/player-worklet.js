// AudioWorklet: the agent's voice, played from a queue on the audio thread (the adaptive jitter buffer).
//
// Chunks of 24 kHz pcm16 arrive on a MessagePort straight from the socket's Worker (transport-worker.js),
// never through the page's main thread: a main-thread stall of a few tens of ms (layout, drawing, GC) used
// to hold back a chunk and be heard as an underrun (bench/notes/latency.md, 6885243). The node's own port
// takes chunks too (tests), and carries the figures back to the page.
//
// What is queued when a chunk arrives (its slack) measures the network and server jitter the buffer
// absorbed: the buffer starts low (`startMs`), grows on an underrun by what was missing plus a step, and
// shrinks slowly once the smallest slack over a window of arrivals shows more margin than it needs, by
// playing slightly fast (not by cutting audio): 2 % for a little spare, up to 8 % for a lot (after a
// stall, late audio arrives in a burst and would otherwise stay on as latency for long). A backlog of
// more than `maxMs` beyond the target is an overrun and dropped, so latency cannot creep.
//
// The audio clock can lose time against the wall: a starved audio thread renders late, and whatever
// arrives meanwhile queues up as extra delay while the server goes on sending 80 ms per 80 ms of wall
// time (the microphone audio of that time never existed; the server padded it with silence). The
// player measures that slip (wall time minus context time since the first chunk) and drops as much from
// the front of the next chunks at once, never below the target (traced in bench/notes/latency.md, 6942395).
//
// Resampling from the wire rate to the context's is linear interpolation with a fractional read
// position; the speed-up is the same read position moving a little faster.

const WIRE_RATE = 24000;
const GROW_STEP_MS = 20; // added on top of what an underrun was missing: one miss should not repeat
// Slack kept above the worst arrival of a window. 10 ms left 2-3 underruns per 30-60 s on a quiet loopback
// echo call; with the buffer on the main thread an A/B of 30 against 40 ms kept 30 (5426bf7). Here, off the main
// thread, 60 s echo calls had no underrun in 4 at 30 ms and 6 at 25 ms (p50 151-159 against 127-157), and 1 in 3
// at 20 ms (bench/notes/latency.md, 9873310).
const MARGIN_MS = 25;
const WINDOW_ARRIVALS = 25; // 2 s of 80 ms chunks: long enough to see the jitter's tail
const MIN_SPEEDUP = 0.02; // 1.6 ms less per 80 ms: inaudible
const MAX_SPEEDUP = 0.08; // 6.4 ms less per 80 ms: about a semitone, and only while far behind
// Audio-clock slip dropped at once beyond this: above the jitter of reading the two clocks (the context's
// clock moves per render quantum, and Date.now() in whole ms).
const SLIP_MS = 15;
const SLIP_READINGS = 4; // chunk arrivals (about 320 ms) whose smallest reading is taken as the slip
const ACK_EVERY_MS = 500; // playback.ack about twice a second: enough for the server's estimate
const FIGURES_EVERY_S = 0.25;

class ParleyPlayerProcessor extends AudioWorkletProcessor {
  constructor({ processorOptions = {} } = {}) {
    super();
    const o = processorOptions;
    this.targetMs = o.startMs ?? 40; // the jitter allowance: how far ahead of now the first chunk after a gap starts
    this.minMs = o.minMs ?? 10;
    this.maxTargetMs = o.maxTargetMs ?? 600;
    this.maxMs = o.maxMs ?? 1000;
    this.marginMs = o.marginMs ?? MARGIN_MS;
    this.dropSlip = o.dropSlip ?? true;
    this.step = WIRE_RATE / sampleRate; // wire samples per output sample
    this.queue = []; // [{samples: Float32Array at the wire rate, sumSquares}], oldest first
    this.head = 0; // fractional read position in queue[0]
    this.queued = 0; // wire samples in the queue, counted from the start of queue[0]
    this.startFrame = null; // context frame the queue starts playing at; null until a chunk primes it
    this.playing = false;
    this.dryFrame = null; // frame at which the queue ran dry while playing (an underrun, counted at the next chunk)
    this.slacks = []; // slack (ms) of the arrivals in the current window
    this.shrinkMs = 0; // buffer still to give back by playing fast
    this.clockOrigin = null; // [Date.now(), context ms] at the first chunk: the slip is measured from there
    this.slipDroppedMs = 0;
    this.lags = []; // the latest readings of (wall - context) time since clockOrigin (ms)
    this.received = 0; // samples received, for chunks that do not say where they end
    this.lastAckMs = 0;
    this.heard = []; // [context time, output sample position] at each chunk's first and last sample since the last ack
    this.nextFigures = 0;
    this.alive = true;
    this.transport = null; // MessagePort to the socket's Worker: chunks in, acks out
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
    this.port.onmessage = ({ data }) => this.onMessage(data);
  }

  onMessage(data) {
    if (data.transport) {
      this.transport = data.transport;
      this.transport.onmessage = ({ data: chunk }) => this.onMessage(chunk);
    }
    if (data.pcm) this.push(data.pcm, data.end);
    if (data.flush) this.flush();
    if (data.figures !== undefined) this.postFigures(data.figures);
    if (data.close) {
      this.alive = false;
      this.transport?.close();
    }
  }

  /** Queued audio not yet played, including the wait before a primed queue starts (ms). */
  get depthMs() {
    const wait = this.startFrame === null ? 0 : Math.max(0, this.startFrame - currentFrame) / sampleRate;
    return ((this.queued - this.head) / WIRE_RATE + wait) * 1000;
  }

  get speed() {
    if (this.shrinkMs <= 0) return 1;
    return 1 + Math.min(MAX_SPEEDUP, Math.max(MIN_SPEEDUP, this.shrinkMs / 2000));
  }

  /** One chunk of int16 samples; `end` is where it ends among the connection's output samples. */
  push(int16, end) {
    this.received = end ?? this.received + int16.length;
    if (int16.length === 0) return;
    const primed = this.startFrame !== null;
    const skip = primed && this.dropSlip ? this.slipToDrop(int16.length) : 0;
    if (skip >= int16.length) return; // the whole chunk arrived for time the audio clock lost
    const samples = new Float32Array(int16.length - skip);
    let sumSquares = 0;
    for (let i = 0; i < samples.length; i++) {
      samples[i] = int16[skip + i] / 32768;
      sumSquares += samples[i] * samples[i];
    }
    const startIn = (ms) => currentFrame + Math.round((ms / 1000) * sampleRate);
    if (!primed) {
      this.startFrame = startIn(this.targetMs);
      this.clockOrigin = [Date.now(), currentTime * 1000];
      this.slipDroppedMs = 0;
      this.lags = [];
    } else if (this.queue.length === 0 && this.dryFrame !== null) {
      // The queue ran dry (the listener heard a gap): allow for at least that much jitter from now on.
      this.stats.underruns++;
      this.grow(((currentFrame - this.dryFrame) / sampleRate) * 1000 + GROW_STEP_MS);
      this.startFrame = startIn(this.targetMs);
    } else if (this.depthMs > this.targetMs + this.maxMs) {
      this.stats.overruns++; // drop the backlog so latency returns to the target
      this.clear();
      this.startFrame = startIn(this.targetMs);
    } else {
      this.observe(this.depthMs);
    }
    this.dryFrame = null;
    const at = currentTime + this.depthMs / 1000;
    this.queue.push({ samples, sumSquares, end: this.received });
    this.queued += samples.length;
    this.stats.chunksScheduled++;
    const duration = samples.length / WIRE_RATE / this.speed;
    this.port.postMessage({ scheduled: { end: this.received, at, duration, receivedAt: currentTime } });
  }

  /**
   * Samples to drop from the front of a chunk of `length` for the audio clock's slip: how far the context's
   * clock has fallen behind the wall since the first chunk, less what was dropped for it already, once beyond
   * SLIP_MS; never more than the queue holds above the target.
   */
  slipToDrop(length) {
    const [wall0, context0] = this.clockOrigin;
    // The context's time moves per render quantum, so one reading is late by up to one: the smallest of the
    // last few is the slip.
    this.lags.push(Date.now() - wall0 - (currentTime * 1000 - context0));
    if (this.lags.length > SLIP_READINGS) this.lags.shift();
    const slipMs = Math.min(...this.lags) - this.slipDroppedMs;
    if (slipMs < -SLIP_MS) this.slipDroppedMs += slipMs; // the audio clock ran ahead (drift): re-baseline
    if (slipMs <= SLIP_MS) return 0;
    const dropMs = Math.min(slipMs, this.depthMs - this.targetMs);
    if (dropMs <= 0) return 0;
    const samples = Math.min(length, Math.round((dropMs / 1000) * WIRE_RATE));
    const droppedMs = (samples / WIRE_RATE) * 1000;
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
   * The spare is the queue's own standing depth, not just the target's: a burst (audio held up by the
   * network, then delivered at once) queues far beyond the target, and capping the give-back at the target
   * left that backlog standing as latency (measured: 300 ms with a 10 ms target after 10 s of 0-200 ms jitter).
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

  process(_inputs, outputs) {
    const out = outputs[0][0];
    const speed = this.speed;
    const advance = this.step * speed;
    let read = 0; // wire samples read in this quantum
    for (let i = 0; i < out.length; i++) {
      if (this.startFrame === null || currentFrame + i < this.startFrame) {
        out[i] = 0;
      } else if (this.queue.length === 0) {
        if (this.playing) this.dryFrame = currentFrame + i;
        this.playing = false;
        out[i] = 0;
      } else {
        this.playing = true;
        const chunk = this.queue[0];
        if (chunk.startedAt === undefined) chunk.startedAt = currentTime + i / sampleRate;
        out[i] = this.sampleAtHead();
        this.head += advance;
        read += advance;
        while (this.queue.length && this.head >= this.queue[0].samples.length) this.finishHead(i);
        if (this.queue.length === 0) this.head = 0; // a fraction of a sample past the end: nothing to carry it to
      }
    }
    if (speed > 1) this.shrinkMs = Math.max(0, this.shrinkMs - (read * (1 - 1 / speed) * 1000) / WIRE_RATE);
    if (currentTime >= this.nextFigures) this.postFigures();
    return this.alive;
  }

  /** The queue's sample at the read position, interpolated towards the next one (in the next chunk at the seam). */
  sampleAtHead() {
    const chunk = this.queue[0].samples;
    const i = Math.floor(this.head);
    const frac = this.head - i;
    const left = chunk[i];
    const right = i + 1 < chunk.length ? chunk[i + 1] : this.queue.length > 1 ? this.queue[1].samples[0] : left;
    return left + (right - left) * frac;
  }

  /**
   * The oldest chunk has been played (its last sample is output sample `i` of this quantum): count it, and
   * acknowledge now and then. The ack names instants too: for each chunk played since the previous ack, where
   * it starts and ends among the connection's output samples and the context times it started and finished
   * playing (`heard`), so that the socket's Worker can say where the microphone stream stood at each (the
   * server's live echo watch lines up what the caller heard with their microphone from them).
   */
  finishHead(i) {
    const { samples, sumSquares, end, startedAt } = this.queue.shift();
    if (end !== undefined && startedAt !== undefined && this.heard.length < 64) {
      this.heard.push([startedAt, end - samples.length], [currentTime + (i + 1) / sampleRate, end]);
    }
    this.head -= samples.length;
    this.queued -= samples.length;
    const s = this.stats;
    s.playedMs += (samples.length / WIRE_RATE) * 1000;
    s.playedSumSquares += sumSquares;
    s.playedSamples += samples.length;
    s.recentPlayedRms = Math.sqrt(sumSquares / samples.length);
    if (s.playedMs - this.lastAckMs >= ACK_EVERY_MS) {
      this.lastAckMs = s.playedMs;
      (this.transport ?? this.port).postMessage({ ack: s.playedMs, heard: this.heard });
      this.heard = [];
    }
  }

  clear() {
    this.queue = [];
    this.head = 0;
    this.queued = 0;
    this.playing = false;
    this.dryFrame = null;
  }

  /** Drop everything queued (pause, stop, barge-in); the next chunk primes again. */
  flush() {
    this.clear();
    this.startFrame = null;
    this.slacks = [];
    this.shrinkMs = 0;
    this.postFigures();
  }

  /** The figures the page shows and the tests read; `request` is echoed for a caller awaiting them. */
  postFigures(request = null) {
    this.nextFigures = currentTime + FIGURES_EVERY_S;
    this.port.postMessage({
      figures: {
        request,
        stats: { ...this.stats },
        targetMs: this.targetMs,
        depthMs: this.depthMs,
        contextTime: currentTime,
      },
    });
  }
}

registerProcessor("parley-player", ParleyPlayerProcessor);
