// The review page: both tracks of a recorded call played in sync (one stereo buffer split into a
// caller and an agent path, each with its own mute), a waveform per track with a playhead, the
// transcript aligned in time, heard-vs-generated and the tick chart. window.review holds test hooks.

import { drawTurnStrip } from "./turn-strip.js";

const root = document.getElementById("review");
const STATUS_POLL_MS = 500;
const UNFINISHED = new Set(["recording", "processing"]);

const hooks = {
  state: "loading", // loading | ready | playing | paused | unavailable
  position: 0,
  duration: 0,
  callerRms: 0, // the loudest RMS heard on each output path since the last play()
  agentRms: 0,
  callerLevel: 0, // the RMS on each output path right now (after its mute)
  agentLevel: 0,
  transcriptLines: 0,
  currentLine: -1,
  seeks: 0,
  stages: [], // every post-processing step the page saw running, in order (with repeats)
  strip: null, // what the turn-taking strip drew: {segments, overlaps, interruptions, responses}
  errors: [],
};
window.review = hooks;

function fmt(seconds) {
  const m = Math.floor(seconds / 60);
  const s = seconds - m * 60;
  return `${m}:${s.toFixed(1).padStart(4, "0")}`;
}

async function fetchJson(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

// ---- waiting for post-processing ------------------------------------------------------------

async function watchProgress() {
  const badge = document.getElementById("status");
  const bar = document.getElementById("progress");
  const label = document.getElementById("progress-label");
  for (;;) {
    try {
      const info = await fetchJson(root.dataset.statusUrl);
      badge.textContent = info.status;
      badge.dataset.statusLabel = info.status;
      bar.hidden = info.status !== "processing";
      bar.value = info.progress;
      // Which step runs now (rendering, transcribing the caller, measuring...), and how far it has come.
      label.textContent = info.status === "processing" ? `${info.stage || "processing"}: ${Math.round(info.progress * 100)} %` : "";
      label.dataset.stage = info.stage ?? "";
      if (info.stage) hooks.stages.push(info.stage);
      if (!UNFINISHED.has(info.status)) {
        window.location.reload(); // the page renders the player once the files exist
        return;
      }
    } catch (err) {
      hooks.errors.push(String(err));
    }
    await new Promise((resolve) => setTimeout(resolve, STATUS_POLL_MS));
  }
}

// ---- player ---------------------------------------------------------------------------------

class SyncPlayer {
  constructor(ctx, buffer) {
    this.ctx = ctx;
    this.buffer = buffer;
    this.offset = 0; // seconds into the call where the current (or next) play starts
    this.startedAt = 0; // ctx.currentTime at that start
    this.source = null;
    // One stereo source -> splitter -> a gain per track (mute) -> merger (caller left, agent right).
    this.splitter = this.ctx.createChannelSplitter(2);
    this.merger = this.ctx.createChannelMerger(2);
    this.gains = [this.ctx.createGain(), this.ctx.createGain()];
    this.analysers = [this.ctx.createAnalyser(), this.ctx.createAnalyser()];
    this.gains.forEach((gain, channel) => {
      this.splitter.connect(gain, channel);
      gain.connect(this.merger, 0, channel);
      gain.connect(this.analysers[channel]);
      this.analysers[channel].fftSize = 2048;
    });
    this.merger.connect(this.ctx.destination);
    this.samples = new Float32Array(2048);
  }

  get playing() {
    return this.source !== null;
  }

  get position() {
    const pos = this.playing ? this.offset + (this.ctx.currentTime - this.startedAt) : this.offset;
    return Math.min(pos, this.buffer.duration);
  }

  async play() {
    if (this.playing) return;
    await this.ctx.resume();
    if (this.offset >= this.buffer.duration - 0.05) this.offset = 0;
    const source = this.ctx.createBufferSource();
    source.buffer = this.buffer;
    source.connect(this.splitter);
    source.onended = () => {
      if (this.source === source) {
        this.offset = this.buffer.duration;
        this.source = null;
        hooks.state = "paused";
        onPlayState();
      }
    };
    this.startedAt = this.ctx.currentTime;
    source.start(0, this.offset);
    this.source = source;
  }

  pause() {
    if (!this.playing) return;
    this.offset = this.position;
    const source = this.source;
    this.source = null;
    source.stop();
  }

  seek(seconds) {
    const wasPlaying = this.playing;
    this.pause();
    this.offset = Math.max(0, Math.min(seconds, this.buffer.duration));
    if (wasPlaying) this.play();
  }

  mute(channel, muted) {
    this.gains[channel].gain.value = muted ? 0 : 1;
  }

  rms(channel) {
    this.analysers[channel].getFloatTimeDomainData(this.samples);
    let sum = 0;
    for (const v of this.samples) sum += v * v;
    return Math.sqrt(sum / this.samples.length);
  }
}

// ---- gaps -------------------------------------------------------------------------------------

const GAP_CAUSES = {
  no_caller_audio: "no audio arrived from the caller",
  engine_behind: "the server was behind",
  pause: "the call was paused",
  detach: "the caller was disconnected",
};

/** The recording's marked silences in words: when, how long, and why (the chart shows them shaded). */
function showGaps(timeline) {
  const gaps = timeline.markers.filter((m) => m.kind === "gap");
  hooks.gaps = gaps.length;
  const list = document.getElementById("gaps");
  if (!list || !gaps.length) return;
  const total = gaps.reduce((sum, m) => sum + m.silence_s, 0);
  document.getElementById("gaps-summary").textContent =
    `${gaps.length} marked silence${gaps.length === 1 ? "" : "s"}, ${total.toFixed(1)} s in all`;
  for (const m of gaps) {
    const item = document.createElement("li");
    item.textContent = `${fmt(m.t)}: ${m.silence_s.toFixed(1)} s of silence, ${GAP_CAUSES[m.cause] ?? m.cause}`;
    list.append(item);
  }
  document.getElementById("gaps-section").hidden = false;
}

// ---- drawing --------------------------------------------------------------------------------

function sizeCanvas(canvas) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(canvas.clientWidth * ratio);
  canvas.height = Math.round(canvas.clientHeight * ratio);
  return canvas.getContext("2d");
}

function drawPeaks(canvas, peaks, color) {
  const g = sizeCanvas(canvas);
  const { width, height } = canvas;
  const mid = height / 2;
  g.fillStyle = color;
  const perPixel = peaks.length / width;
  for (let x = 0; x < width; x++) {
    let peak = 0;
    const from = Math.floor(x * perPixel);
    const to = Math.max(from + 1, Math.floor((x + 1) * perPixel));
    for (let i = from; i < to && i < peaks.length; i++) peak = Math.max(peak, peaks[i]);
    const h = Math.max(1, peak * (height - 4));
    g.fillRect(x, mid - h / 2, 1, h);
  }
  return g.getImageData(0, 0, width, height);
}

function drawTimeline(canvas, timeline, duration) {
  const g = sizeCanvas(canvas);
  const { width, height } = canvas;
  const x = (t) => (t / duration) * width;
  for (const m of timeline.markers) {
    if (m.kind === "gap") {
      // Marked silence: call time the recording has no audio for (hatched, so it never reads as quiet speech).
      g.fillStyle = "rgba(176,120,0,.22)";
      g.fillRect(x(m.t), 0, Math.max(2, x(m.end) - x(m.t)), height);
    }
  }
  for (const m of timeline.markers) {
    if (m.kind === "pause" || m.kind === "detach") {
      g.fillStyle = "rgba(120,120,120,.35)";
      g.fillRect(x(m.t) - 3, 0, 6, height);
      g.fillStyle = "#444";
      g.font = `${11 * (window.devicePixelRatio || 1)}px system-ui`;
      const wall = m.wall_s === null ? "" : ` ${m.wall_s.toFixed(1)} s`;
      g.fillText(`${m.kind}${wall}`, x(m.t) + 5, 14 * (window.devicePixelRatio || 1));
    } else if (m.kind === "speak" || m.kind === "listen") {
      g.fillStyle = m.kind === "speak" ? "#2e7d32" : "#bbb";
      g.fillRect(x(m.t), height - 8, Math.max(2, x(timeline.period_ms / 1000)), 8);
    }
  }
  // Heard vs generated: how much of the agent's audio had been sent but not yet played by the caller.
  const heard = timeline.heard;
  const maxLag = Math.max(400, ...heard.map((h) => h.sent_ms - h.played_ms));
  if (heard.length) {
    g.fillStyle = "rgba(29,95,168,.45)";
    g.beginPath();
    g.moveTo(x(heard[0].t), height - 10);
    for (const h of heard) g.lineTo(x(h.t), height - 10 - ((h.sent_ms - h.played_ms) / maxLag) * (height - 30));
    g.lineTo(x(heard[heard.length - 1].t), height - 10);
    g.closePath();
    g.fill();
    g.fillStyle = "#1d5fa8";
    g.fillText(`max ${Math.round(maxLag)} ms unheard`, width - 170 * (window.devicePixelRatio || 1), height - 14);
  }
  for (const m of timeline.markers) {
    if (m.kind === "barge_in") {
      g.fillStyle = "#d12a2a";
      g.fillRect(x(m.t) - 1, 0, 2, height);
      if (m.unplayed_ms) g.fillText(`cut ${Math.round(m.unplayed_ms)} ms`, x(m.t) + 4, height / 2);
    }
  }
  return g.getImageData(0, 0, width, height);
}

function drawTicks(canvas, timeline, duration) {
  const g = sizeCanvas(canvas);
  const { width, height } = canvas;
  const ticks = timeline.ticks;
  const period = timeline.period_ms;
  const top = Math.max(period * 1.2, ...ticks.map((t) => t[1]));
  const y = (ms) => height - 4 - (ms / top) * (height - 8);
  g.strokeStyle = "#d12a2a";
  g.setLineDash([6, 4]);
  g.beginPath();
  g.moveTo(0, y(period));
  g.lineTo(width, y(period));
  g.stroke();
  g.setLineDash([]);
  g.strokeStyle = "#1d2b3a";
  g.beginPath();
  ticks.forEach(([t, ms], i) => {
    const px = (t / duration) * width;
    if (i === 0) g.moveTo(px, y(ms));
    else g.lineTo(px, y(ms));
  });
  g.stroke();
  g.fillStyle = "#444";
  g.font = `${11 * (window.devicePixelRatio || 1)}px system-ui`;
  g.fillText(`deadline ${period} ms`, 4, y(period) - 4);
  return g.getImageData(0, 0, width, height);
}

function withPlayhead(canvas, image, position, duration) {
  const g = canvas.getContext("2d");
  g.putImageData(image, 0, 0);
  const px = (position / duration) * canvas.width;
  g.fillStyle = "#ff6d00";
  g.fillRect(px - 1, 0, 2, canvas.height);
}

// ---- transcript -----------------------------------------------------------------------------

// Who said a line: chat messages are "user"; post-processing transcribes the caller's track as "caller".
const SPEAKER_LABELS = { user: "User: ", caller: "Caller: ", agent: "Agent: " };

function renderTranscript(lines, seek) {
  const list = document.getElementById("transcript");
  const callerHeard = lines.some((line) => line.speaker === "caller");
  list.replaceChildren(
    ...lines.map((line, i) => {
      const item = document.createElement("li");
      item.dataset.line = String(i);
      item.dataset.start = String(line.start);
      const at = document.createElement("span");
      at.className = "at";
      at.textContent = fmt(line.start);
      const text = document.createElement("span");
      text.textContent = line.text;
      if (line.speaker || callerHeard) {
        // A chat message, or a side of a transcribed call (the agent's reply lines carry no speaker).
        const who = document.createElement("strong");
        who.textContent = SPEAKER_LABELS[line.speaker ?? "agent"] ?? "Assistant (history): ";
        item.dataset.speaker = line.speaker ?? "agent";
        item.append(at, who, text);
      } else {
        item.append(at, text);
      }
      item.addEventListener("click", () => seek(line.start));
      return item;
    }),
  );
  if (lines.length === 0) {
    const item = document.createElement("li");
    item.textContent = "The model said nothing in this call.";
    list.append(item);
  }
  return [...list.querySelectorAll("li[data-line]")];
}

function currentLine(lines, position) {
  let index = -1;
  for (let i = 0; i < lines.length; i++) if (lines[i].start <= position + 1e-3) index = i;
  return index;
}

// ---- page -----------------------------------------------------------------------------------

function onPlayState() {
  const button = document.getElementById("play");
  button.textContent = hooks.state === "playing" ? "Pause" : "Play";
}

async function main() {
  document.getElementById("delete-form").addEventListener("submit", (event) => {
    if (!window.confirm("Delete this recording and its files?")) event.preventDefault();
  });
  const status = root.dataset.status;
  if (UNFINISHED.has(status)) {
    hooks.state = "unavailable";
    watchProgress();
    return;
  }
  if (root.dataset.playable !== "true") {
    hooks.state = "unavailable";
    return;
  }
  const [peaks, transcript, timeline, audio] = await Promise.all([
    fetchJson(root.dataset.peaksUrl),
    fetchJson(root.dataset.transcriptUrl),
    fetchJson(root.dataset.timelineUrl),
    fetch(root.dataset.oggUrl).then((r) => {
      if (!r.ok) throw new Error(`audio: HTTP ${r.status}`);
      return r.arrayBuffer();
    }),
  ]);
  const ctx = new AudioContext();
  const player = new SyncPlayer(ctx, await ctx.decodeAudioData(audio));
  const duration = player.buffer.duration;
  hooks.duration = duration;
  document.getElementById("tick-stats").textContent = `${timeline.tick_ms_p50} / ${timeline.tick_ms_p99} ms`;
  showGaps(timeline);

  const canvases = {
    caller: document.getElementById("wave-caller"),
    agent: document.getElementById("wave-agent"),
    timeline: document.getElementById("timeline"),
    ticks: document.getElementById("ticks"),
  };
  const measures = document.getElementById("turn-taking-data"); // absent when the call was not measured
  const turnTaking = measures ? JSON.parse(measures.textContent) : null;
  if (turnTaking?.segments) canvases.strip = document.getElementById("turn-strip");
  let images = {};
  const redraw = () => {
    images = {
      caller: drawPeaks(canvases.caller, peaks.caller, "#1d5fa8"),
      agent: drawPeaks(canvases.agent, peaks.agent, "#2e7d32"),
      timeline: drawTimeline(canvases.timeline, timeline, duration),
      ticks: drawTicks(canvases.ticks, timeline, duration),
    };
    if (canvases.strip) {
      const strip = drawTurnStrip(canvases.strip, turnTaking, duration);
      images.strip = strip.image;
      hooks.strip = strip.counts;
    }
  };
  redraw();
  window.addEventListener("resize", redraw);

  const seek = (seconds) => {
    player.seek(seconds);
    hooks.seeks += 1;
  };
  for (const canvas of Object.values(canvases)) {
    canvas.addEventListener("click", (event) => {
      const rect = canvas.getBoundingClientRect();
      seek(((event.clientX - rect.left) / rect.width) * duration);
    });
  }
  const lines = transcript.lines;
  const items = renderTranscript(lines, seek);
  hooks.transcriptLines = lines.length;

  const play = document.getElementById("play");
  play.disabled = false;
  play.addEventListener("click", async () => {
    if (player.playing) {
      player.pause();
      hooks.state = "paused";
    } else {
      hooks.callerRms = hooks.agentRms = 0;
      await player.play();
      hooks.state = "playing";
    }
    onPlayState();
  });
  document.getElementById("mute-caller").addEventListener("change", (e) => player.mute(0, e.target.checked));
  document.getElementById("mute-agent").addEventListener("change", (e) => player.mute(1, e.target.checked));

  const clock = document.getElementById("clock");
  const frame = () => {
    const position = player.position;
    hooks.position = position;
    if (player.playing) {
      hooks.callerLevel = player.rms(0);
      hooks.agentLevel = player.rms(1);
      hooks.callerRms = Math.max(hooks.callerRms, hooks.callerLevel);
      hooks.agentRms = Math.max(hooks.agentRms, hooks.agentLevel);
    }
    clock.textContent = `${fmt(position)} / ${fmt(duration)}`;
    for (const [name, canvas] of Object.entries(canvases)) withPlayhead(canvas, images[name], position, duration);
    const index = currentLine(lines, position);
    if (index !== hooks.currentLine) {
      items.forEach((item, i) => item.classList.toggle("current", i === index));
      if (index >= 0) items[index].scrollIntoView({ block: "nearest" });
      hooks.currentLine = index;
    }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
  hooks.state = "ready";
}

main().catch((err) => {
  hooks.errors.push(String(err));
  hooks.state = "unavailable";
  const reason = document.createElement("p");
  reason.className = "reason";
  reason.textContent = `The recording could not be loaded: ${err.message || err}`;
  root.prepend(reason);
});
