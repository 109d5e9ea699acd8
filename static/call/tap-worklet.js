// AudioWorklet for latency measurement (test hook, loaded only with ?tap=1): records what the
// microphone delivers into the audio graph (input 0) and what the page sends to the destination
// (input 1) in the same render quanta, so both share one clock to the sample. tests/browser/
// latency_probe.py cross-correlates them to measure true mouth-to-ear.

const BLOCK_FRAMES = 8192; // posted about every 190 ms at 44.1 kHz

class ParleyTapProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.start = -1; // context frame of the first sample in the current block
    this.filled = 0;
    this.mic = new Float32Array(BLOCK_FRAMES);
    this.out = new Float32Array(BLOCK_FRAMES);
  }

  process(inputs) {
    const quantum = 128;
    // A quantum that does not follow the previous one (a starved audio thread skipped render quanta,
    // or rendered one frame position twice) ends the block: each block is contiguous on the context clock.
    if (this.filled > 0 && currentFrame !== this.start + this.filled) this.post();
    if (this.filled === 0) this.start = currentFrame;
    copyMono(inputs[0], this.mic, this.filled, quantum);
    copyMono(inputs[1], this.out, this.filled, quantum);
    this.filled += quantum;
    if (this.filled === BLOCK_FRAMES) this.post();
    return true;
  }

  post() {
    const mic = this.mic.slice(0, this.filled);
    const out = this.out.slice(0, this.filled);
    this.port.postMessage({ start: this.start, mic, out }, [mic.buffer, out.buffer]);
    this.filled = 0;
  }
}

// The first channel is enough (the page's graph is mono); an idle input has no channels: silence.
function copyMono(input, target, offset, length) {
  if (input && input.length > 0) target.set(input[0].subarray(0, length), offset);
}

registerProcessor("parley-tap", ParleyTapProcessor);
