// Test hooks: plain numbers and strings on `window.parley`, updated as the call runs, so browser
// tests (and a curious person in the console) can read the call's state without reaching into
// the modules. Nothing reads these back; they are a one-way window.

export const hooks = {
  state: "idle",
  warmStart: null, // the server's warm start as the page last read it: "off", "warming", "ready" or "failed"
  stateHistory: ["idle"], // every state the page went through, in order (bounded)
  sessionId: null,
  resumed: null,
  capabilities: null,
  recorded: null, // session.duplex.record as the server last reported it
  sessionNames: null, // {persona, version, voice} as the last session.updated named them
  muted: false,
  outputVolume: 1,
  speakerId: null, // the output device chosen with the speaker picker (null: the system default)
  framesSent: 0,
  imagesSent: 0,
  micRms: 0,
  audioChunksReceived: 0,
  audioMsReceived: 0,
  receivedRms: 0,
  playedRms: 0,
  playedMs: 0,
  bufferMs: 0,
  mouthToEarMs: null, // measured (latency.js), refreshed about once a second
  latencyParts: null, // where that time went: {capture, roundTrip, buffer, output} (ms)
  firstAudioMs: null, // from pressing Start to the first agent audio reaching the speaker
  // Where that time went: ms after Start at which each step of the start was done (audio graph, microphone,
  // socket open, session.created, first agent chunk received, first agent audio at the speaker).
  startTimeline: null,
  jitter: null, // the jitter buffer's target (ms) and how often it grew and shrank (player-worklet.js)
  underruns: 0,
  overruns: 0,
  // Pauses in the uplink while live: {at, ms} for each pair of consecutive microphone pieces sent more than
  // 50 ms apart (at: when the later one was sent, ms since the page's time origin; bounded).
  uplinkGaps: [],
  audioClock: null, // {contextMs, performanceMs}: the audio clock beside the page's, refreshed twice a second
  transcript: "",
  units: [],
  queue: null, // the last session.queued event
  prefillProgress: [], // progress values of session.prefill events, as received (bounded)
  metrics: null,
  serverStatus: null, // the latest session.status: {level, code, message}
  statusLines: {}, // the warning each kind of session.status shows now: {server, echo} ("" when none)
  echoLoop: null, // the test-only echo loop, when installed: {db, ms}
  closeReason: null,
  errors: [],
  eventCounts: {},
};

window.parley = hooks;

/** Count one server event of `type` (hooks.eventCounts). */
export function countEvent(type) {
  hooks.eventCounts[type] = (hooks.eventCounts[type] ?? 0) + 1;
}

/** Append to a hook list, keeping only the newest `limit` entries. */
export function pushBounded(list, value, limit) {
  list.push(value);
  if (list.length > limit) list.shift();
}

/**
 * Latency tap (tests and benchmarks only, `?tap=1`): record the microphone as it enters the audio
 * graph and the page's output as it reaches the destination, sample-aligned, and expose them as
 * `window.parleyTap.drain()` -> {rate, outputLatency, start, frames, mic, out} (base64 pcm16, the
 * audio since the previous drain). See tests/browser/latency_probe.py.
 */
export async function installTap(ctx, micSource, output) {
  await ctx.audioWorklet.addModule(new URL("./tap-worklet.js", import.meta.url));
  const node = new AudioWorkletNode(ctx, "parley-tap", { numberOfInputs: 2, numberOfOutputs: 0 });
  const blocks = [];
  node.port.onmessage = ({ data }) => blocks.push(data);
  micSource.connect(node, 0, 0);
  output.connect(node, 0, 1);
  window.parleyTap = {
    drain() {
      const taken = blocks.splice(0);
      const frames = taken.reduce((n, b) => n + b.mic.length, 0);
      const join = (key) => {
        const pcm = new Int16Array(frames);
        let at = 0;
        for (const b of taken) for (const v of b[key]) pcm[at++] = Math.max(-32768, Math.min(32767, Math.round(v * 32768)));
        return new Uint8Array(pcm.buffer).toBase64();
      };
      return {
        rate: ctx.sampleRate,
        outputLatency: (ctx.baseLatency ?? 0) + (ctx.outputLatency ?? 0),
        start: taken.length ? taken[0].start : null,
        frames,
        blocks: taken.map((b) => [b.start, b.mic.length]), // each contiguous on the context clock
        mic: join("mic"),
        out: join("out"),
      };
    },
  };
}


/**
 * Echo loop (tests only, `?test_echo_loop=DB,MS`): the agent's audio as played (`output`, before the volume)
 * goes DB decibels down and MS milliseconds late into the microphone's worklet (`micNode`), summed with the
 * microphone, as a speaker heard by the microphone would. hooks.echoLoop says what was installed.
 */
export function installEchoLoop(ctx, output, micNode, spec) {
  const [db, ms] = spec.split(",").map(Number.parseFloat);
  if (!Number.isFinite(db) || !Number.isFinite(ms) || ms < 0 || ms > 1000) return;
  const delay = ctx.createDelay(1);
  delay.delayTime.value = ms / 1000;
  const gain = ctx.createGain();
  gain.gain.value = 10 ** (db / 20);
  output.connect(delay).connect(gain).connect(micNode);
  hooks.echoLoop = { db, ms };
}
