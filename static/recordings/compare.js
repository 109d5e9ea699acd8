// The compare view: two agents' tracks against the one caller track, played together from one clock.
// Both recordings are stereo (caller left, agent right); A's left gives the caller, each right its agent.
// Both sources start at the same AudioContext time and offset, so they stay sample-aligned; a seek restarts
// both. window.compare holds test hooks: each side's playhead and the level heard on each agent's path.

const sides = [...document.querySelectorAll(".compare-side")];
const hooks = { state: "loading", positions: [0, 0], agentRms: [0, 0], callerRms: 0, duration: 0, seeks: 0, errors: [] };
window.compare = hooks;

function fmt(s) {
  const m = Math.floor(s / 60);
  return `${m}:${(s - m * 60).toFixed(1).padStart(4, "0")}`;
}

function drawPeaks(canvas, peaks, color) {
  const g = canvas.getContext("2d");
  const { width, height } = canvas;
  g.clearRect(0, 0, width, height);
  g.fillStyle = color;
  peaks.forEach((p, i) => {
    const x = (i / peaks.length) * width;
    const h = Math.max(1, p * height);
    g.fillRect(x, (height - h) / 2, Math.max(1, width / peaks.length), h);
  });
  return g.getImageData(0, 0, width, height);
}

function playhead(canvas, image, position, duration) {
  const g = canvas.getContext("2d");
  g.putImageData(image, 0, 0);
  g.fillStyle = "#c62828";
  g.fillRect((position / duration) * canvas.width, 0, 2, canvas.height);
}

function rms(analyser, buffer) {
  analyser.getFloatTimeDomainData(buffer);
  let sum = 0;
  for (const v of buffer) sum += v * v;
  return Math.sqrt(sum / buffer.length);
}

async function load(side) {
  if (side.dataset.status !== "ready" && side.dataset.status !== "partial") {
    throw new Error(`recording ${side.dataset.side} is ${side.dataset.status}: reload once it is ready`);
  }
  const [peaks, audio] = await Promise.all([
    fetch(side.dataset.peaksUrl).then((r) => r.json()),
    fetch(side.dataset.oggUrl).then((r) => r.arrayBuffer()),
  ]);
  return { peaks, audio };
}

async function main() {
  const loaded = await Promise.all(sides.map(load));
  const ctx = new AudioContext();
  const buffers = await Promise.all(loaded.map((l) => ctx.decodeAudioData(l.audio)));
  const duration = Math.max(...buffers.map((b) => b.duration));
  hooks.duration = duration;
  const merger = ctx.createChannelMerger(2);
  merger.connect(ctx.destination);
  const analysers = [ctx.createAnalyser(), ctx.createAnalyser(), ctx.createAnalyser()]; // caller, A, B
  const gains = [ctx.createGain(), ctx.createGain()];
  const splitters = buffers.map(() => ctx.createChannelSplitter(2));
  splitters[0].connect(analysers[0], 0); // the caller, from A (the same track in both)
  splitters[0].connect(merger, 0, 0);
  splitters.forEach((splitter, i) => {
    splitter.connect(gains[i], 1);
    gains[i].connect(analysers[i + 1]);
    gains[i].connect(merger, 0, 1);
  });
  const sample = new Float32Array(2048);
  const state = { sources: [], offset: 0, startedAt: 0 };
  const position = () => (state.sources.length ? state.offset + ctx.currentTime - state.startedAt : state.offset);
  const stop = () => {
    state.offset = Math.min(position(), duration);
    state.sources.forEach((s) => s.stop());
    state.sources = [];
  };
  const start = async () => {
    await ctx.resume();
    if (state.offset >= duration - 0.05) state.offset = 0;
    const when = ctx.currentTime + 0.05; // one start time for both: they play sample-aligned
    state.sources = buffers.map((buffer, i) => {
      const source = ctx.createBufferSource();
      source.buffer = buffer;
      source.connect(splitters[i]);
      source.start(when, Math.min(state.offset, buffer.duration));
      source.startedAt = when; // each side's own clock, reported separately
      source.offsetAt = state.offset;
      return source;
    });
    state.startedAt = when;
  };
  const caller = document.getElementById("wave-caller");
  const callerImage = drawPeaks(caller, loaded[0].peaks.caller, "#1d5fa8");
  const agentCanvases = sides.map((side) => side.querySelector(".agent-wave"));
  const agentImages = agentCanvases.map((canvas, i) => drawPeaks(canvas, loaded[i].peaks.agent, "#2e7d32"));
  const seek = (seconds) => {
    const playing = state.sources.length > 0;
    if (playing) stop();
    state.offset = Math.max(0, Math.min(seconds, duration));
    hooks.seeks++;
    if (playing) start();
  };
  for (const canvas of [caller, ...agentCanvases]) {
    canvas.addEventListener("click", (e) => {
      const rect = canvas.getBoundingClientRect();
      seek(((e.clientX - rect.left) / rect.width) * duration);
    });
  }
  document.getElementById("listen").addEventListener("change", (e) => {
    const v = e.target.value;
    gains.forEach((g, i) => (g.gain.value = v === "both" || v === String(i) ? 1 : 0));
  });
  const play = document.getElementById("play");
  play.disabled = false;
  play.addEventListener("click", async () => {
    if (state.sources.length) {
      stop();
      hooks.state = "paused";
    } else {
      hooks.agentRms = [0, 0];
      hooks.callerRms = 0;
      await start();
      hooks.state = "playing";
    }
  });
  const clock = document.getElementById("clock");
  const tick = () => {
    const now = Math.min(position(), duration);
    hooks.positions = state.sources.length
      ? state.sources.map((s) => Math.min(s.offsetAt + Math.max(0, ctx.currentTime - s.startedAt), duration))
      : [state.offset, state.offset];
    if (state.sources.length && ctx.currentTime >= state.startedAt) {
      hooks.callerRms = Math.max(hooks.callerRms, rms(analysers[0], sample));
      hooks.agentRms = hooks.agentRms.map((v, i) => Math.max(v, rms(analysers[i + 1], sample)));
      if (now >= duration) {
        stop();
        hooks.state = "paused";
      }
    }
    clock.textContent = `${fmt(now)} / ${fmt(duration)}`;
    playhead(caller, callerImage, now, duration);
    agentCanvases.forEach((canvas, i) => playhead(canvas, agentImages[i], now, duration));
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
  hooks.state = "ready";
}

main().catch((err) => {
  hooks.errors.push(String(err));
  hooks.state = "unavailable";
});
