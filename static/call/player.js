// Jitter buffer for the agent's voice: 24 kHz pcm16 chunks scheduled back to back on the AudioContext.
//
// Network arrival is bursty, so each chunk is scheduled at the end of the previous one, and the
// first chunk after a gap waits `targetMs` so that small delays do not cut the voice. A gap the
// buffer could not bridge is an underrun; a backlog beyond `maxMs` (the tab was throttled, the
// server burst) is an overrun, and we drop the backlog rather than let latency creep.

/** The page's pcm16 rate on /v1/realtime, both ways (the mic worklet produces it too). */
export const WIRE_RATE = 24000;

export class JitterPlayer {
  /**
   * @param {AudioContext} ctx
   * @param {{rate?: number, targetMs?: number, maxMs?: number, onAck?: (playedMs: number) => void}} options
   */
  constructor(ctx, { rate = WIRE_RATE, targetMs = 160, maxMs = 1200, onAck = null } = {}) {
    this.ctx = ctx;
    this.rate = rate;
    this.targetMs = targetMs;
    this.maxMs = maxMs;
    this.onAck = onAck;
    this.gain = ctx.createGain();
    this.analyser = ctx.createAnalyser(); // the output waveform view reads from here
    this.analyser.fftSize = 2048;
    this.gain.connect(this.analyser).connect(ctx.destination);
    this.cursor = 0; // context time at which the next chunk starts
    this.primed = false; // false until the first chunk after start/reset is scheduled
    this.live = new Set(); // sources scheduled and not yet ended, so flush() can stop them
    this.stats = {
      chunksScheduled: 0,
      underruns: 0,
      overruns: 0,
      playedMs: 0,
      playedSumSquares: 0,
      playedSamples: 0,
      recentPlayedRms: 0,
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

  /** Schedule one chunk of little-endian int16 samples at `this.rate`. */
  push(int16) {
    if (int16.length === 0) return;
    const samples = new Float32Array(int16.length);
    let sumSquares = 0;
    for (let i = 0; i < int16.length; i++) {
      samples[i] = int16[i] / 32768;
      sumSquares += samples[i] * samples[i];
    }
    const now = this.ctx.currentTime;
    const target = this.targetMs / 1000;
    if (!this.primed) {
      this.cursor = now + target;
      this.primed = true;
    } else if (this.cursor < now) {
      this.stats.underruns++; // the buffer ran dry: the listener heard a gap
      this.cursor = now + target;
    } else if (this.cursor - now > this.maxMs / 1000) {
      this.stats.overruns++; // drop the backlog so latency returns to the target
      this.flush();
      this.primed = true;
      this.cursor = now + target;
    }
    const buffer = this.ctx.createBuffer(1, samples.length, this.rate);
    buffer.copyToChannel(samples, 0);
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.gain);
    source.onended = () => this.ended(source, samples.length, sumSquares);
    source.start(this.cursor);
    this.cursor += buffer.duration;
    this.live.add(source);
    this.stats.chunksScheduled++;
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
    this.cursor = this.ctx.currentTime;
  }
}

/** Decode base64 pcm16 (little-endian) into an Int16Array. */
export function base64ToInt16(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return new Int16Array(bytes.buffer, 0, bytes.length >> 1);
}

/** Encode Float32 samples in [-1, 1] as base64 pcm16 little-endian. */
export function float32ToBase64Pcm16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    const clamped = Math.max(-1, Math.min(1, samples[i]));
    out[i] = clamped < 0 ? clamped * 32768 : clamped * 32767;
  }
  return bytesToBase64(new Uint8Array(out.buffer));
}

/** Encode bytes as base64 (audio frames, camera JPEGs). */
export function bytesToBase64(bytes) {
  let binary = "";
  // Chunked: String.fromCharCode(...bytes) would overflow the argument limit on large payloads.
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}
