// AudioWorklet: microphone -> 24 kHz mono pieces of 480 samples (20 ms), plus a level per piece
// and the AudioContext time at which the piece's last sample entered the graph. The pieces go to the
// node's port, or, once the page hands over a port of the socket's Worker ({transport: port}), straight
// there: the uplink never waits for the page's main thread (transport-worker.js).
//
// Why small pieces: a sample waits in the worklet until its piece is full, so the piece length
// is pure added latency (an 80 ms frame adds 0-80 ms by itself). The server cuts the stream into
// engine frames aligned to its own tick (inference/audio/framing.py), so the page need not. Why not
// smaller: each piece is one WebSocket message, and on a busy 2-core server 10 ms pieces cost a
// third more server CPU than 20 ms ones and got delayed in its event loop (bench/latency_browser.py).
// Why a worklet: ScriptProcessorNode is deprecated and runs on the main thread, where a busy
// page would drop samples. Why resample here: the context runs at whatever rate the device
// picked (headless chromium: 44.1 kHz, laptops: 48 kHz), and the server's engine clock is
// 24 kHz * 80 ms. We read the real rate from the worklet global `sampleRate` and never assume it.
//
// Resampling is linear interpolation with a fractional read position carried across blocks.
// Speech energy sits far below 12 kHz, so the aliasing this allows is inaudible for our use and
// keeps the frame level equal to the source level (the tests compare levels).

const OUTPUT_RATE = 24000;
const PIECE_SAMPLES = 480;

class ParleyMicProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / OUTPUT_RATE; // input samples advanced per output sample
    this.readPos = 0; // read position relative to the current block; -1 means `lastSample`
    this.lastSample = 0; // final sample of the previous block, to interpolate across the seam
    this.frame = new Float32Array(PIECE_SAMPLES);
    this.filled = 0;
    this.sumSquares = 0;
    this.out = this.port;
    this.port.onmessage = ({ data }) => {
      if (data.transport) this.out = data.transport;
    };
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0 || input[0].length === 0) return true; // no source yet
    const block = downmix(input);
    const last = block.length - 1;
    // Produce every output sample whose two neighbours are available in this block.
    while (this.readPos < last) {
      const base = Math.floor(this.readPos);
      const frac = this.readPos - base;
      const left = base < 0 ? this.lastSample : block[base];
      const right = block[base + 1];
      this.push(left + (right - left) * frac, currentTime + this.readPos / sampleRate);
      this.readPos += this.step;
    }
    this.readPos -= block.length;
    this.lastSample = block[last];
    return true;
  }

  push(sample, time) {
    this.frame[this.filled++] = sample;
    this.sumSquares += sample * sample;
    if (this.filled === PIECE_SAMPLES) {
      const rms = Math.sqrt(this.sumSquares / PIECE_SAMPLES);
      // Transfer the buffer (no copy) and start a fresh one.
      this.out.postMessage({ frame: this.frame, rms, time }, [this.frame.buffer]);
      this.frame = new Float32Array(PIECE_SAMPLES);
      this.filled = 0;
      this.sumSquares = 0;
    }
  }
}

// Average all channels into one: a stereo device must not double the level.
function downmix(channels) {
  if (channels.length === 1) return channels[0];
  const out = new Float32Array(channels[0].length);
  for (const ch of channels) for (let i = 0; i < out.length; i++) out[i] += ch[i] / channels.length;
  return out;
}

registerProcessor("parley-mic", ParleyMicProcessor);
