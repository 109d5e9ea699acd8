// The call page's view: everything that touches the DOM lives here, so call.js reads as protocol
// and audio logic only. The controller calls set*/push* methods; the view never sends anything.

import { drawSeries, drawUnits, drawWaveform } from "./charts.js";

const $ = (id) => document.getElementById(id);

const STATE_LABELS = {
  warming: "Getting the agent ready…", // the server is still loading the engine (warm-start.js)
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
// The agent's words more than this long after its previous words start a new line (a new turn).
const TURN_GAP_MS = 2000;
const SPEAKERS = { agent: "Agent", caller: "You" };
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
    this.openLine = null; // the transcript line words are still being added to: {li, speaker, lastAt}
    this.transcriptChars = 0;
    this.setState("idle");
  }

  /** @param {Record<string, () => void>} handlers keyed like this.buttons */
  bind(handlers) {
    for (const [name, handler] of Object.entries(handlers)) this.buttons[name].addEventListener("click", handler);
  }

  /**
   * A saved persona fills the text box and picks its default voice; the text box is what is sent, so it can
   * still be edited. The persona shown when the page opens is applied at once, like one picked later.
   * ?persona=<id> and ?voice=<id> (links from the persona and voice pages) choose them on arrival.
   */
  bindPersonaPresets(params = new URLSearchParams()) {
    const preset = $("persona-preset");
    const applyPreset = () => {
      const option = preset.selectedOptions[0];
      $("persona").value = option?.dataset.instructions ?? "";
      this.chooseVoice(option?.dataset.defaultVoice);
    };
    preset?.addEventListener("change", () => {
      applyPreset();
      this.showVoicePreview();
    });
    if (preset) {
      const asked = params.get("persona");
      if (asked && [...preset.options].some((o) => o.value === asked)) preset.value = asked;
      applyPreset();
    }
    this.chooseVoice(params.get("voice"));
    $("voice")?.addEventListener("change", () => this.showVoicePreview());
    this.showVoicePreview();
  }

  /** Select the voice with this id if it is offered (a ready voice the user may use). */
  chooseVoice(id) {
    if (id && [...$("voice").options].some((o) => o.value === id)) $("voice").value = id;
  }

  /** What the server says the session runs with (session.updated / session.created): names, not ids. */
  setSessionNames(duplex) {
    const persona = duplex.persona_name
      ? `${duplex.persona_name}${duplex.persona_version ? ` (version ${duplex.persona_version})` : ""}`
      : duplex.persona
        ? "your own instructions"
        : "engine default";
    $("persona-shown").textContent = persona;
    $("voice-shown").textContent = duplex.voice || "engine default";
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
    const editable = ENABLED.start.includes(state) || state === "warming";
    $("persona").disabled = !editable;
    $("voice").disabled = !editable;
    $("mic-device").disabled = !editable; // the microphone is opened at Start
    if (state !== "queued") this.setQueue(null);
    if (state !== "prefilling") this.setPrefill(null);
    if (state === "connecting") {
      this.showRecordingLink(null); // a new call: the last one's link is old news
      this.openLine = null; // and its words start new lines
    }
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
    if (progress === null) {
      this.prefillSeen = null;
      return;
    }
    $("prefill-bar").value = progress;
    $("prefill-label").textContent = `${Math.round(progress * 100)} %${prefillLeft(this, progress)}`;
  }

  /** After a recorded call: a link to its recording (null hides it). */
  showRecordingLink(url) {
    $("after-call").hidden = !url;
    if (url) $("recording-link").href = url;
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

  /**
   * Words of one speaker ("agent" or "caller") at `atMs` after Start: added to that speaker's open line, or
   * to a new line (labelled, timed) when the other speaker spoke in between or the speaker paused.
   * `replace` sets the line's whole text (a caller's completed transcription after its deltas).
   */
  appendTranscript(speaker, text, atMs, { replace = false } = {}) {
    const box = $("transcript");
    const stuck = box.scrollTop + box.clientHeight >= box.scrollHeight - 8; // follow unless the user scrolled up
    const open = this.openLine;
    const line =
      open && open.speaker === speaker && atMs - open.lastAt <= TURN_GAP_MS ? open : this.newTranscriptLine(box, speaker, atMs);
    const said = line.li.querySelector(".said");
    this.transcriptChars += text.length - (replace ? said.textContent.length : 0);
    if (replace) said.textContent = text;
    else said.append(text);
    line.lastAt = atMs;
    // A long call's transcript would grow the DOM without bound: keep the most recent lines.
    while (this.transcriptChars > TRANSCRIPT_DOM_CHARS && box.firstElementChild && box.firstElementChild !== line.li) {
      this.transcriptChars -= box.firstElementChild.querySelector(".said").textContent.length;
      box.firstElementChild.remove();
    }
    if (stuck) box.scrollTop = box.scrollHeight;
  }

  /** The speaker's turn is over (its transcript is done): their next words start a new line. */
  endTranscriptLine(speaker) {
    if (this.openLine?.speaker === speaker) this.openLine = null;
  }

  newTranscriptLine(box, speaker, atMs) {
    const li = document.createElement("li");
    li.dataset.speaker = speaker;
    const who = Object.assign(document.createElement("span"), { className: "who", textContent: SPEAKERS[speaker] ?? speaker });
    const at = Object.assign(document.createElement("time"), { className: "at", textContent: clock(atMs) });
    at.dateTime = `PT${Math.max(0, atMs / 1000).toFixed(1)}S`;
    li.append(who, at, Object.assign(document.createElement("span"), { className: "said" }));
    box.append(li);
    this.openLine = { li, speaker, lastAt: atMs };
    return this.openLine;
  }

  setMicLevel(rms) {
    // dBFS mapped from -60..0 onto the bar: speech sits around -30..-10 dBFS.
    const db = 20 * Math.log10(Math.max(rms, 1e-6));
    const fraction = Math.min(1, Math.max(0, (db + 60) / 60));
    const text = levelText(rms);
    $("mic-level-fill").style.width = `${(fraction * 100).toFixed(1)}%`;
    $("mic-level-db").textContent = text;
    // The meter's value as text for a screen reader (the bar itself is only a picture).
    const meter = $("mic-meter");
    meter.setAttribute("aria-valuenow", String(Math.round(Math.max(-60, Math.min(0, db)))));
    meter.setAttribute("aria-valuetext", text);
  }

  /** Mute: the button says what pressing it does next, and whether it is pressed. */
  setMuted(muted) {
    const button = $("mute");
    button.textContent = muted ? "Unmute" : "Mute";
    button.setAttribute("aria-pressed", String(muted));
  }

  /** The agent's volume, 0..1.5, as a percentage beside the slider (and for a screen reader). */
  showVolume(volume) {
    const text = `${Math.round(volume * 100)} %`;
    $("volume-value").textContent = text;
    $("volume").setAttribute("aria-valuetext", text);
  }

  /** The speaker picker is offered only where the browser can route the page's audio. */
  showSpeakerPicker(shown) {
    $("speaker-row").hidden = !shown;
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
    // The chart's latest values in words, for a screen reader (the canvas is only a picture).
    const ms = (v) => (Number.isFinite(v) ? `${Math.round(v)} ms` : "not measured yet");
    $("latency-summary").textContent =
      `Latest: mouth-to-ear ${ms(mouthToEar)}, playback buffer ${ms(depth)}, server tick p99 ${ms(tickP99)}.`;
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

  /**
   * The line that says the server is behind, or that the agent hears itself ("" hides it: it has caught up,
   * or the call ended). `message` is one string, or the warnings by kind ({server, echo}).
   */
  setServerStatus(message) {
    const line = $("server-status");
    const text = typeof message === "string" ? message : Object.values(message).filter(Boolean).join(" ");
    line.textContent = text;
    line.hidden = !text;
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
    let frames = 0;
    const loop = () => {
      if (!this.analyser) {
        this.waveformLoop = null;
        return;
      }
      this.analyser.getFloatTimeDomainData(samples);
      drawWaveform($("output-wave"), samples);
      if (++frames % 15 === 0) $("output-level").textContent = levelText(rms(samples)); // about 4 a second
      this.waveformLoop = requestAnimationFrame(loop);
    };
    this.waveformLoop = requestAnimationFrame(loop);
  }

  stopDrawing() {
    this.analyser = null;
  }
}

/** m:ss since Start. */
function clock(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

/** A level as text: "silence" or "-17 dBFS". */
function levelText(rmsValue) {
  const db = 20 * Math.log10(Math.max(rmsValue, 1e-6));
  return db < -90 ? "silence" : `${db.toFixed(0)} dBFS`;
}

function rms(samples) {
  let sum = 0;
  for (const v of samples) sum += v * v;
  return Math.sqrt(sum / samples.length);
}

/** " · about 5 s left" from the prefill's pace so far (nothing until there is enough of it to go on). */
function prefillLeft(ui, progress) {
  const now = performance.now();
  if (!ui.prefillSeen) ui.prefillSeen = { at: now, progress };
  const done = progress - ui.prefillSeen.progress;
  const elapsed = now - ui.prefillSeen.at;
  if (done <= 0.02 || elapsed < 500) return " · estimating the time left…";
  const left = ((1 - progress) * elapsed) / done / 1000;
  return left < 1 ? " · almost ready" : ` · about ${Math.ceil(left)} s left`;
}
