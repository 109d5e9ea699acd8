// The agent's voice on the page: the jitter buffer runs on the audio thread (player-worklet.js); this is its
// handle on the main thread, which only wires the graph, forwards what the worklet reports and draws it.

/** The page's pcm16 rate on /v1/realtime, both ways (the mic worklet produces it too). */
export const WIRE_RATE = 24000;

export class JitterPlayer {
  /**
   * Load the worklet module into `ctx` (once per context) and make a player.
   * @param {AudioContext} ctx
   * @param {{startMs?: number, minMs?: number, maxTargetMs?: number, maxMs?: number, marginMs?: number,
   *          dropSlip?: boolean, onAck?: (playedMs: number) => void,
   *          onStart?: (chunk: {end: number, at: number, duration: number, receivedAt: number}) => void}} options
   *   onStart is called with each chunk's schedule: where it ends among the connection's output samples, the
   *   context time it starts playing, its duration (s) and the context time it arrived. onAck is called when
   *   no socket port is attached (the worklet otherwise acks through it).
   */
  static async create(ctx, options = {}) {
    await ctx.audioWorklet.addModule(new URL("./player-worklet.js", import.meta.url));
    return new JitterPlayer(ctx, options);
  }

  constructor(ctx, { onAck = null, onStart = null, ...processorOptions } = {}) {
    this.ctx = ctx;
    this.onAck = onAck;
    this.onStart = onStart;
    const defined = Object.fromEntries(Object.entries(processorOptions).filter(([, v]) => v !== undefined));
    this.node = new AudioWorkletNode(ctx, "parley-player", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: defined,
    });
    this.gain = ctx.createGain();
    this.analyser = ctx.createAnalyser(); // the output waveform view reads from here
    this.analyser.fftSize = 2048;
    // The listener's volume comes last: the waveform and the latency tap (hooks.js) see the audio as it arrived.
    this.volume = ctx.createGain();
    this.node.connect(this.gain).connect(this.analyser).connect(this.volume).connect(ctx.destination);
    // The worklet's latest figures (refreshed four times a second and on every flush).
    this.stats = { chunksScheduled: 0, underruns: 0, overruns: 0, grows: 0, shrinks: 0, playedMs: 0, slipDroppedMs: 0 };
    this.targetMs = processorOptions.startMs ?? 40;
    this.depthMs = 0;
    this.playedRms = 0;
    this.waiting = new Map(); // figures requests awaiting their answer
    this.requests = 0;
    this.node.port.onmessage = ({ data }) => this.onMessage(data);
  }

  onMessage(data) {
    if (data.scheduled) this.onStart?.(data.scheduled);
    if (data.ack !== undefined) this.onAck?.(data.ack);
    const figures = data.figures;
    if (figures) {
      const s = figures.stats;
      this.stats = s;
      this.targetMs = figures.targetMs;
      // The worklet's reading, aged by the time since: the queue plays on meanwhile.
      this.depthMs = Math.max(0, figures.depthMs - (this.ctx.currentTime - figures.contextTime) * 1000);
      this.playedRms = s.playedSamples ? Math.sqrt(s.playedSumSquares / s.playedSamples) : 0;
      this.waiting.get(figures.request)?.(figures);
      this.waiting.delete(figures.request);
    }
  }

  /** Chunks come from this port from now on (the socket's Worker holds its other end); acks go back on it. */
  feedFrom(port) {
    this.node.port.postMessage({ transport: port }, [port]);
  }

  /** Queue one chunk of int16 samples (the buffer is transferred: the caller's array is emptied). */
  push(int16, end = undefined) {
    this.node.port.postMessage({ pcm: int16, end }, [int16.buffer]);
  }

  /** Drop everything queued (pause, stop, barge-in); the next chunk primes again. */
  flush() {
    this.node.port.postMessage({ flush: true });
  }

  /** The worklet's figures as of now (after every message sent before this call). */
  figures() {
    const request = ++this.requests;
    return new Promise((resolve) => {
      this.waiting.set(request, resolve);
      this.node.port.postMessage({ figures: request });
    });
  }

  close() {
    this.node.port.postMessage({ close: true });
    this.node.disconnect();
  }
}
