// Measured mouth-to-ear for the call page, from timestamps only (no estimate, works for any engine).
//
// The page notes when each piece of microphone audio entered the audio graph (the mic worklet's
// context time) and when each chunk of agent audio is scheduled to play (the player worklet's, on
// the same clock). About once a second the server's session.metrics name one tick: it had heard the
// input up to sample `heard_input_samples` of this connection, and its audio ends at sample
// `heard_output_samples` of what it sent us. So:
//
//   mouth-to-ear = (context time the end of that chunk plays) - (context time that input sample
//                  entered the graph) + the output latency the AudioContext reports
//
// which is what a sound at the end of a frame takes from microphone to speaker through capture,
// framing, the network both ways, the tick, the jitter buffer and the output. With the echo engine
// at zero delay it equals the chirp cross-correlation of tests/browser/latency_probe.py.

import { WIRE_RATE } from "./player.js";

const KEEP = 2000; // ring entries: 40 s of 20 ms pieces, minutes of chunks

export class LatencyMeter {
  constructor(ctx) {
    this.ctx = ctx;
    this.sent = []; // [cumulative input samples sent, context time the last one entered the graph, sent at]
    this.sentSamples = 0;
    this.played = []; // [cumulative output samples received, context time that sample ends playing, received at]
    this.lastHeard = null;
    this.lastMs = null;
    // Where the latest figure's time went (ms): capture (worklet + page until sent), round trip
    // (socket, server, tick, socket), buffer (received until its end plays) and output.
    this.parts = null;
  }

  /** A piece of microphone audio was sent at `sentAt`; `time` is when its last sample entered the graph. */
  noteSent(samples, time, sentAt) {
    this.sentSamples += samples;
    push(this.sent, [this.sentSamples, time, sentAt]);
  }

  /**
   * An agent chunk ending at received sample `receivedEnd` arrived at `receivedAt` and plays from `at` for
   * `duration` s (context times).
   */
  noteScheduled(receivedEnd, at, duration, receivedAt) {
    push(this.played, [receivedEnd, at + duration, receivedAt]);
  }

  /** Mouth-to-ear (ms) of the tick the metrics name, or the previous figure when they name no new one. */
  measure(metrics) {
    const heardIn = metrics?.heard_input_samples;
    const heardOut = metrics?.heard_output_samples;
    if (!Number.isFinite(heardIn) || !Number.isFinite(heardOut)) return this.lastMs;
    const key = `${heardIn}/${heardOut}`;
    if (key === this.lastHeard) return this.lastMs;
    this.lastHeard = key;
    const mouth = inputTime(this.sent, heardIn);
    const ear = chunkEnd(this.played, heardOut);
    if (mouth === null || ear === null) return this.lastMs;
    const output = (this.ctx.baseLatency ?? 0) + (this.ctx.outputLatency ?? 0);
    this.lastMs = (ear.end - mouth.time + output) * 1000;
    const ms = (s) => Math.round(s * 1000);
    this.parts = {
      capture: ms(mouth.sentAt - mouth.time),
      roundTrip: ms(ear.receivedAt - mouth.sentAt),
      buffer: ms(ear.end - ear.receivedAt),
      output: ms(output),
    };
    return this.lastMs;
  }
}

function push(ring, entry) {
  ring.push(entry);
  if (ring.length > KEEP) ring.splice(0, ring.length - KEEP);
}

/** When input sample `position` entered the graph: inside its piece, at the wire rate. */
function inputTime(ring, position) {
  for (let i = ring.length - 1; i > 0; i--) {
    const [end, time] = ring[i];
    if (ring[i - 1][0] < position && position <= end) return { time: time - (end - position) / WIRE_RATE, sentAt: ring[i][2] };
  }
  return null; // not recorded (too old, or not sent yet): skip rather than guess
}

/** When the chunk ending at output sample `position` finishes playing (chunks are whole units). */
function chunkEnd(ring, position) {
  for (let i = ring.length - 1; i >= 0; i--) {
    if (ring[i][0] === position) return { end: ring[i][1], receivedAt: ring[i][2] };
    if (ring[i][0] < position) return null;
  }
  return null;
}
