// The call page's view: everything that touches the DOM lives here, so call.js reads as protocol
// and audio logic only. The controller calls set*/push* methods; the view never sends anything.

import { drawSeries, drawUnits, drawWaveform } from "./charts.js";

const $ = (id) => document.getElementById(id);

const STATE_LABELS = {
  idle: "Ready to call",
  connecting: "Connecting…",
  queued: "Waiting for a free slot",
  prefilling: "Preparing the agent",
  live: "Live",
  pausing: "Pausing…",
  paused: "Paused",
  resuming: "Resuming…",
  closing: "Ending…",
  closed: "Call ended",
  replaced: "Taken over by another window",
  disconnected: "Disconnected",
  failed: "Failed",
};

// Which buttons make sense in which state.
const ENABLED = {
  start: ["idle", "closed", "disconnected", "failed"],
  pause: ["live"],
  resume: ["paused"],
  stop: ["connecting", "queued", "prefilling", "live", "pausing", "paused", "resuming"],
  cancel: ["live"],
  forceListen: ["live"],
  camera: ["live", "paused"],
};

const TRANSCRIPT_DOM_CHARS = 40_000;
const LATENCY_POINTS = 120; // 60 s at one point per 500 ms

export class CallUi {
  constructor() {
    this.buttons = {
      start: $("start"),
      pause: $("pause"),
      resume: $("resume"),
      stop: $("stop"),
      cancel: $("cancel"),
      forceListen: $("force-listen"),
      camera: $("camera"),
    };
    this.latency = { mouthToEar: [], depth: [], tickP99: [] };
    this.units = [];
    this.analyser = null;
    this.waveformLoop = null; // the requestAnimationFrame id while the output waveform is drawn
    this.setState("idle");
  }

  /** @param {Record<string, () => void>} handlers keyed like this.buttons */
  bind(handlers) {
    for (const [name, handler] of Object.entries(handlers)) this.buttons[name].addEventListener("click", handler);
  }

  /** A saved persona fills the text box; the text box is what is sent, so it can still be edited. */
  bindPersonaPresets() {
    $("persona-preset")?.addEventListener("change", (event) => {
      const option = event.target.selectedOptions[0];
      $("persona").value = option?.dataset.instructions ?? "";
      const voice = option?.dataset.defaultVoice;
      if (voice && [...$("voice").options].some((o) => o.value === voice)) $("voice").value = voice;
      this.showVoicePreview();
    });
    $("voice")?.addEventListener("change", () => this.showVoicePreview());
    this.showVoicePreview();
  }

  /** A few seconds of the chosen voice, playable before the call starts. */
  showVoicePreview() {
    const option = $("voice")?.selectedOptions[0];
    const preview = $("voice-preview");
    if (!preview) return;
    const url = option?.dataset.previewUrl;
    preview.hidden = !url;
    if (url && preview.getAttribute("src") !== url) preview.src = url;
  }

  /** The saved persona's id while the text box still holds its text unchanged, else null. */
  personaId() {
    const option = $("persona-preset")?.selectedOptions[0];
    if (!option || option.dataset.instructions !== $("persona").value) return null;
    return option.value;
  }

  /** Show what the server rendered about the default engine (banner, controls) before a call. */
  showPreview() {
    const preview = $("capabilities-preview");
    if (preview) this.setCapabilities(JSON.parse(preview.textContent));
  }

  cameraPreview() {
    return $("camera-preview");
  }

  persona() {
    return $("persona").value.trim();
  }

  voice() {
    return $("voice").value;
  }

  /** A resumed session keeps the persona it started with: show that one, not the text box's draft. */
  showPersona(text) {
    $("persona").value = text;
  }

  setState(state, detail = "") {
    const badge = $("call-state");
    badge.dataset.state = state;
    badge.textContent = STATE_LABELS[state] ?? state;
    $("call-state-detail").textContent = detail;
    for (const [name, states] of Object.entries(ENABLED)) this.buttons[name].disabled = !states.includes(state);
    // Persona and voice are fixed once a session exists; editing them mid-call would be ignored.
    const editable = ENABLED.start.includes(state);
    $("persona").disabled = !editable;
    $("voice").disabled = !editable;
    if (state !== "queued") this.setQueue(null);
    if (state !== "prefilling") this.setPrefill(null);
  }

  setQueue(queued) {
    $("queue").hidden = !queued;
    if (!queued) return;
    const wait = Number.isFinite(queued.estimated_wait_s) ? `, about ${Math.ceil(queued.estimated_wait_s)} s` : "";
    $("queue").textContent = `Position ${queued.position} of ${queued.queue_length}${wait}`;
  }

  setPrefill(progress) {
    const wrap = $("prefill");
    wrap.hidden = progress === null;
    if (progress === null) return;
    $("prefill-bar").value = progress;
    $("prefill-label").textContent = `${Math.round(progress * 100)} %`;
  }

  /** The visible mark that this call is being recorded (session.duplex.record, as the server applied it). */
  setRecording(on) {
    $("recording-mark").hidden = !on;
  }

  setSession(id, resumed) {
    $("session-id").textContent = id ? `${id}${resumed ? " (resumed)" : ""}` : "–";
  }

  setCapabilities(caps) {
    $("engine").textContent = caps ? `${caps.engine} · ${caps.chunk_period_ms} ms chunks` : "–";
    const isDemo = Boolean(caps && (caps.demo_weights || caps.engine === "echo"));
    $("demo-banner").hidden = !isDemo;
    $("banner-echo").hidden = !(caps && caps.engine === "echo");
    $("banner-demo").hidden = !(caps && caps.engine !== "echo" && caps.demo_weights);
    const unitEngine = Boolean(caps && caps.chunk_period_ms >= 1000);
    $("units").hidden = !unitEngine;
    this.buttons.forceListen.hidden = !unitEngine;
    this.buttons.camera.hidden = !(caps && caps.video);
    this.buttons.cancel.hidden = !(caps && caps.barge_in);
  }

  setCameraOn(on) {
    this.buttons.camera.textContent = on ? "Camera off" : "Camera on";
    $("camera-preview").hidden = !on;
  }

  appendTranscript(text) {
    const box = $("transcript");
    const stuck = box.scrollTop + box.clientHeight >= box.scrollHeight - 8; // follow unless the user scrolled up
    box.append(text);
    // A long call's transcript would grow the DOM without bound: keep the most recent part.
    if (box.textContent.length > TRANSCRIPT_DOM_CHARS) box.textContent = box.textContent.slice(-TRANSCRIPT_DOM_CHARS / 2);
    if (stuck) box.scrollTop = box.scrollHeight;
  }

  setMicLevel(rms) {
    // dBFS mapped from -60..0 onto the bar: speech sits around -30..-10 dBFS.
    const db = 20 * Math.log10(Math.max(rms, 1e-6));
    const fraction = Math.min(1, Math.max(0, (db + 60) / 60));
    $("mic-level-fill").style.width = `${(fraction * 100).toFixed(1)}%`;
    $("mic-level-db").textContent = db < -90 ? "silence" : `${db.toFixed(0)} dBFS`;
  }

  /** @param {Record<string, number|string|null>} figures keyed by the data-figure attributes */
  setFigures(figures) {
    for (const [key, value] of Object.entries(figures)) {
      const cell = document.querySelector(`[data-figure="${key}"]`);
      if (cell) cell.textContent = value === null || value === undefined ? "–" : String(value);
    }
  }

  /** A figure's breakdown, shown when the pointer rests on it. */
  setFigureDetail(key, text) {
    const cell = document.querySelector(`[data-figure="${key}"]`);
    if (cell) cell.title = text;
  }

  pushLatency({ mouthToEar, depth, tickP99 }) {
    for (const [key, value] of Object.entries({ mouthToEar, depth, tickP99 })) {
      const list = this.latency[key];
      list.push(value ?? NaN);
      if (list.length > LATENCY_POINTS) list.shift();
    }
    drawSeries(
      $("latency-chart"),
      [
        { label: "mouth-to-ear (measured)", color: "#c2410c", values: this.latency.mouthToEar },
        { label: "playback buffer", color: "#2f6fde", values: this.latency.depth },
        { label: "server tick p99", color: "#2e9d5b", values: this.latency.tickP99 },
      ],
      LATENCY_POINTS,
    );
  }

  addUnit(unit) {
    this.units.push(unit);
    if (this.units.length > 60) this.units.shift();
    drawUnits($("units-chart"), this.units);
    $("units-last").textContent = `unit ${unit.unit}: ${unit.kind}${unit.endOfTurn ? " (end of turn)" : ""}`;
  }

  /** The line that says the server is behind ("" hides it: it has caught up, or the call ended). */
  setServerStatus(message) {
    const line = $("server-status");
    line.textContent = message;
    line.hidden = !message;
  }

  notice(message, level = "info") {
    const box = $("notice");
    box.textContent = message;
    box.dataset.level = level;
    box.hidden = !message;
  }

  /** Draw the agent's output waveform every animation frame while a call runs. */
  drawOutput(analyser) {
    this.analyser = analyser;
    if (this.waveformLoop) return;
    const samples = new Float32Array(analyser.fftSize);
    const loop = () => {
      if (!this.analyser) {
        this.waveformLoop = null;
        return;
      }
      this.analyser.getFloatTimeDomainData(samples);
      drawWaveform($("output-wave"), samples);
      this.waveformLoop = requestAnimationFrame(loop);
    };
    this.waveformLoop = requestAnimationFrame(loop);
  }

  stopDrawing() {
    this.analyser = null;
  }
}
