// Round-trip tracking for the mouth-to-ear estimate.
//
// For lockstep engines output frame k answers input frame k, so the time between sending input
// sample n and receiving output sample n is the server round trip: network, queueing and the
// tick itself (model delay, such as the echo engine's 240 ms, is behaviour, not transport).

const FRAME_SAMPLES = 1920; // 80 ms at 24 kHz, both directions
const KEEP_SENT = 500; // frames remembered: 40 s, far beyond any sane round trip
const KEEP_TRIPS = 25; // the median of the last 2 s of round trips

export class RoundTrips {
  constructor() {
    this.reset();
  }

  reset() {
    this.sentAt = new Map(); // frame index -> performance.now()
    this.framesSent = 0;
    this.samplesReceived = 0;
    this.trips = [];
  }

  frameSent() {
    this.sentAt.set(this.framesSent++, performance.now());
    if (this.sentAt.size > KEEP_SENT) this.sentAt.delete(this.sentAt.keys().next().value);
  }

  audioReceived(samples) {
    this.samplesReceived += samples;
    const frame = Math.floor(this.samplesReceived / FRAME_SAMPLES) - 1;
    const sentAt = this.sentAt.get(frame);
    if (sentAt === undefined) return;
    this.trips.push(performance.now() - sentAt);
    if (this.trips.length > KEEP_TRIPS) this.trips.shift();
  }

  /** Median of recent round trips in ms, or null before the first. */
  medianMs() {
    if (!this.trips.length) return null;
    const sorted = [...this.trips].sort((a, b) => a - b);
    return sorted[Math.floor(sorted.length / 2)];
  }
}
