// The call page's controller: microphone -> /v1/realtime -> jitter buffer, and the session's state.
//
// Protocol: docs/protocol.md (OpenAI Realtime events plus Parley's duplex extensions). Audio goes
// up as base64 pcm16 at 24 kHz in 80 ms frames; the agent's audio comes down the same way.
// Test hooks live on `window.parley` (plain numbers and strings, updated as events arrive), so
// browser tests can assert on behaviour without reaching into this module.

import { JitterPlayer, base64ToInt16, float32ToBase64Pcm16 } from "./player.js";
import { CallUi } from "./ui.js";

const RATE = 24000;
const FRAME_SAMPLES = 1920;
const TRANSCRIPT_HOOK_LIMIT = 200_000; // characters kept on window.parley.transcript
const params = new URLSearchParams(location.search);
// Tests (and people debugging levels) pass ?raw=1: the browser's echo canceller, noise
// suppressor and gain control would otherwise reshape the fake microphone's signal.
const RAW_AUDIO = params.get("raw") === "1";
const MODEL = params.get("model");

const hooks = {
  state: "idle",
  stateHistory: ["idle"], // every state the page went through, in order (bounded)
  sessionId: null,
  resumed: null,
  capabilities: null,
  framesSent: 0,
  imagesSent: 0,
  micRms: 0,
  audioChunksReceived: 0,
  audioMsReceived: 0,
  receivedRms: 0,
  playedRms: 0,
  playedMs: 0,
  bufferMs: 0,
  underruns: 0,
  overruns: 0,
  transcript: "",
  units: [],
  queue: null, // the last session.queued event
  prefillProgress: [], // progress values of session.prefill events, as received (bounded)
  metrics: null,
  closeReason: null,
  errors: [],
  eventCounts: {},
};
window.parley = hooks;

class Call {
  constructor(ui) {
    this.ui = ui;
    this.ctx = null;
    this.ws = null;
    this.player = null;
    this.mic = null; // {stream, source, node}
    this.camera = null; // {stream, video, timer}
    this.state = "idle";
    this.receivedSumSquares = 0;
    this.receivedSamples = 0;
    this.sendTimes = new Map(); // frame index -> performance.now(), for the round-trip estimate
    this.outputSamples = 0;
    this.roundTrips = [];
    this.figuresTimer = null;
  }

  setState(state, detail = "") {
    if (this.state !== state) {
      hooks.stateHistory.push(state);
      if (hooks.stateHistory.length > 100) hooks.stateHistory.shift();
    }
    this.state = state;
    hooks.state = state;
    this.ui.setState(state, detail);
  }

  // ---- user actions --------------------------------------------------------------------------

  /** Start (or reconnect). Runs inside the click handler: autoplay rules want the AudioContext made here. */
  async start() {
    this.ctx = new AudioContext({ latencyHint: "interactive" });
    const resuming = this.ctx.resume(); // still inside the user gesture
    this.setState("connecting");
    this.ui.notice("");
    try {
      await resuming;
      await this.ctx.audioWorklet.addModule(new URL("./mic-worklet.js", import.meta.url));
      await this.openMicrophone();
    } catch (err) {
      this.fail(`Microphone unavailable: ${err.message}`);
      return;
    }
    this.player = new JitterPlayer(this.ctx, { rate: RATE, onAck: (ms) => this.send({ type: "playback.ack", played_ms: ms }) });
    this.ui.drawOutput(this.player.analyser);
    this.resetLatencyTracking();
    this.connect();
    this.figuresTimer = setInterval(() => this.refreshFigures(), 500);
  }

  pause() {
    this.setState("pausing");
    this.player.flush(); // the listener should hear the pause at once, not after the buffer drains
    this.send({ type: "session.pause" });
  }

  resume() {
    this.setState("resuming");
    this.send({ type: "session.resume" });
  }

  stop() {
    if (this.state === "connecting" || this.state === "queued") {
      // Nothing to end on the server yet: leaving the queue is just closing the socket.
      this.send({ type: "session.close" });
      this.teardown("closed", "You left the queue.");
      return;
    }
    this.setState("closing");
    this.player?.flush();
    this.send({ type: "session.close" });
    // If the server never confirms, do not leave the page hanging in "Ending…".
    setTimeout(() => {
      if (this.state === "closing") this.teardown("closed", "The server did not confirm; the socket was closed.");
    }, 5000);
  }

  cancel() {
    this.player.flush();
    this.send({ type: "response.cancel" });
  }

  forceListen() {
    this.send({ type: "response.force_listen" });
  }

  async toggleCamera() {
    if (this.camera) {
      this.stopCamera();
      return;
    }
    try {
      const stream = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480 } });
      const video = document.getElementById("camera-preview");
      video.srcObject = stream;
      await video.play();
      const canvas = document.createElement("canvas");
      // One frame per second is what the omni engines consume; more would only queue up.
      const timer = setInterval(() => this.sendCameraFrame(video, canvas), 1000);
      this.camera = { stream, video, timer };
      this.ui.setCameraOn(true);
    } catch (err) {
      this.ui.notice(`Camera unavailable: ${err.message}`, "error");
    }
  }

  // ---- audio in ------------------------------------------------------------------------------

  async openMicrophone() {
    const constraints = {
      channelCount: 1,
      echoCancellation: !RAW_AUDIO,
      noiseSuppression: !RAW_AUDIO,
      autoGainControl: !RAW_AUDIO,
    };
    const stream = await navigator.mediaDevices.getUserMedia({ audio: constraints });
    const source = this.ctx.createMediaStreamSource(stream);
    const node = new AudioWorkletNode(this.ctx, "parley-mic", { numberOfInputs: 1, numberOfOutputs: 0 });
    node.port.onmessage = ({ data }) => this.onMicFrame(data.frame, data.rms);
    source.connect(node); // the worklet runs while an input is connected; no need to reach the speakers
    this.mic = { stream, source, node };
  }

  onMicFrame(frame, rms) {
    hooks.micRms = rms;
    this.ui.setMicLevel(rms);
    // Only a live session takes audio: queued or prefilling sessions would answer session_not_ready,
    // and a paused slot is frozen, not fed.
    if (this.state !== "live") return;
    const index = hooks.framesSent;
    if (this.send({ type: "input_audio_buffer.append", audio: float32ToBase64Pcm16(frame) })) {
      hooks.framesSent++;
      this.sendTimes.set(index, performance.now());
      if (this.sendTimes.size > 500) this.sendTimes.delete(this.sendTimes.keys().next().value);
    }
  }

  sendCameraFrame(video, canvas) {
    if (this.state !== "live" || !video.videoWidth) return;
    canvas.width = video.videoWidth;
    canvas.height = video.videoHeight;
    canvas.getContext("2d").drawImage(video, 0, 0);
    canvas.toBlob(
      async (blob) => {
        if (!blob) return;
        const bytes = new Uint8Array(await blob.arrayBuffer());
        let binary = "";
        for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        if (this.send({ type: "input_image.append", image: btoa(binary) })) hooks.imagesSent++;
      },
      "image/jpeg",
      0.8,
    );
  }

  // ---- socket --------------------------------------------------------------------------------

  connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = MODEL ? `?model=${encodeURIComponent(MODEL)}` : "";
    const ws = new WebSocket(`${scheme}://${location.host}/v1/realtime${query}`); // the session cookie authenticates
    this.ws = ws;
    ws.onmessage = (message) => this.onMessage(message.data);
    ws.onclose = (event) => {
      if (this.ws !== ws) return; // an old socket after a reconnect
      if (["closed", "replaced", "failed"].includes(this.state)) return;
      this.teardown("disconnected", `The connection closed (code ${event.code}). Start again within 30 s to resume.`);
    };
  }

  /**
   * Configure the session once it exists (the server refuses events before session.created).
   * A resumed or taken-over session keeps its persona and voice: they are fixed once audio began.
   */
  sendSessionUpdate(resumed) {
    const session = { type: "realtime", audio: { input: { format: { type: "audio/pcm", rate: RATE } } } };
    const persona = this.ui.persona();
    const voice = this.ui.voice();
    if (!resumed && persona) session.instructions = persona;
    if (!resumed && voice) session.audio.output = { voice };
    this.send({ type: "session.update", session });
  }

  send(event) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(event));
    return true;
  }

  onMessage(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      hooks.errors.push({ code: "client_invalid_json", message: String(data).slice(0, 200) });
      return;
    }
    hooks.eventCounts[event.type] = (hooks.eventCounts[event.type] ?? 0) + 1;
    const handler = HANDLERS[event.type];
    if (!handler) return; // standard events the page has no use for (response.created, ...)
    try {
      handler(this, event);
    } catch (err) {
      // A malformed event (bad base64, missing fields) is dropped; the call goes on.
      hooks.errors.push({ code: "client_bad_event", type: event.type, message: String(err) });
    }
  }

  // ---- teardown ------------------------------------------------------------------------------

  teardown(state, detail) {
    this.stopCamera();
    if (this.mic) {
      this.mic.stream.getTracks().forEach((track) => track.stop());
      this.mic.source.disconnect();
      this.mic.node.port.onmessage = null;
      this.mic = null;
    }
    this.player?.flush();
    this.ui.stopDrawing();
    clearInterval(this.figuresTimer);
    this.refreshFigures();
    const ws = this.ws;
    this.ws = null;
    if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000);
    this.ctx?.close();
    this.ctx = null;
    this.setState(state, detail);
  }

  fail(message) {
    this.ui.notice(message, "error");
    this.teardown("failed", message);
  }

  stopCamera() {
    if (!this.camera) return;
    clearInterval(this.camera.timer);
    this.camera.stream.getTracks().forEach((track) => track.stop());
    this.camera = null;
    this.ui.setCameraOn(false);
  }

  // ---- figures -------------------------------------------------------------------------------

  resetLatencyTracking() {
    this.sendTimes.clear();
    this.outputSamples = 0;
    this.roundTrips = [];
    hooks.framesSent = 0;
  }

  /**
   * For lockstep engines output frame k answers input frame k, so the time between sending input
   * sample n and receiving output sample n is the server round trip (network, queueing, tick).
   */
  trackRoundTrip(samples) {
    this.outputSamples += samples;
    const frame = Math.floor(this.outputSamples / FRAME_SAMPLES) - 1;
    const sentAt = this.sendTimes.get(frame);
    if (sentAt === undefined) return;
    this.roundTrips.push(performance.now() - sentAt);
    if (this.roundTrips.length > 25) this.roundTrips.shift();
  }

  /** Mouth-to-ear estimate: frame capture + server round trip + playback buffer + device output. */
  mouthToEarMs() {
    const caps = hooks.capabilities;
    if (!caps || !this.ctx) return null;
    const output = ((this.ctx.baseLatency ?? 0) + (this.ctx.outputLatency ?? 0)) * 1000;
    let server;
    if (this.roundTrips.length && caps.chunk_period_ms < 1000) server = median(this.roundTrips);
    else if (hooks.metrics) server = (hooks.metrics.tick_ms_p50 ?? 0) + (hooks.metrics.lag_ms ?? 0);
    else return null;
    return caps.chunk_period_ms + server + (this.player?.depthMs ?? 0) + output;
  }

  refreshFigures() {
    const player = this.player;
    if (player) {
      hooks.playedRms = player.playedRms;
      hooks.playedMs = player.stats.playedMs;
      hooks.bufferMs = player.depthMs;
      hooks.underruns = player.stats.underruns;
      hooks.overruns = player.stats.overruns;
    }
    const m = hooks.metrics ?? {};
    const mouthToEar = this.mouthToEarMs();
    this.ui.setFigures({
      tick_p50: fmt(m.tick_ms_p50),
      tick_p99: fmt(m.tick_ms_p99),
      lag: fmt(m.lag_ms),
      frames_in: m.frames_in,
      frames_out: m.frames_out,
      dropped: m.dropped_frames,
      buffer: fmt(hooks.bufferMs),
      underruns: hooks.underruns,
      overruns: hooks.overruns,
      mouth_to_ear: fmt(mouthToEar),
      frames_sent: hooks.framesSent,
      chunks_received: hooks.audioChunksReceived,
    });
    if (this.ctx) this.ui.pushLatency({ mouthToEar, depth: hooks.bufferMs, tickP99: m.tick_ms_p99 });
  }
}

// ---- server events ------------------------------------------------------------------------------

const HANDLERS = {
  "session.queued"(call, e) {
    hooks.queue = { position: e.position, queue_length: e.queue_length, estimated_wait_s: e.estimated_wait_s };
    call.setState("queued");
    call.ui.setQueue(e);
  },
  "session.created"(call, e) {
    const session = e.session ?? {};
    const duplex = session.duplex ?? {};
    hooks.sessionId = session.id ?? null;
    hooks.resumed = Boolean(e.resumed ?? duplex.resumed);
    hooks.capabilities = duplex.capabilities ?? null;
    call.ui.setSession(hooks.sessionId, hooks.resumed);
    call.ui.setCapabilities(hooks.capabilities);
    if (hooks.resumed && duplex.persona) call.ui.showPersona(duplex.persona);
    // Sent before the state turns live, so the server applies it before the first audio frame.
    call.sendSessionUpdate(hooks.resumed);
    call.setState("live");
  },
  "session.prefill"(call, e) {
    hooks.prefillProgress.push(e.progress);
    if (hooks.prefillProgress.length > 200) hooks.prefillProgress.shift();
    const done = e.done || e.progress >= 1;
    if (done) {
      if (call.state === "prefilling") call.setState("live");
      return;
    }
    if (call.state !== "prefilling") call.setState("prefilling");
    call.ui.setPrefill(e.progress ?? 0);
  },
  "response.output_audio.delta"(call, e) {
    const pcm = base64ToInt16(e.delta ?? "");
    hooks.audioChunksReceived++;
    hooks.audioMsReceived += (pcm.length / RATE) * 1000;
    let sumSquares = 0;
    for (let i = 0; i < pcm.length; i++) sumSquares += (pcm[i] / 32768) ** 2;
    call.receivedSumSquares += sumSquares;
    call.receivedSamples += pcm.length;
    hooks.receivedRms = call.receivedSamples ? Math.sqrt(call.receivedSumSquares / call.receivedSamples) : 0;
    call.trackRoundTrip(pcm.length);
    if (call.state === "prefilling") call.setState("live"); // audio means the prefill is over
    // Audio still in flight when the user paused must not play after the pause.
    if (call.state === "live" && call.player) call.player.push(pcm);
  },
  "response.output_audio_transcript.delta"(call, e) {
    const text = e.delta ?? "";
    if (hooks.transcript.length < TRANSCRIPT_HOOK_LIMIT) hooks.transcript += text;
    call.ui.appendTranscript(text);
  },
  "response.listen"(call, e) {
    addUnit(call, "listen", e);
  },
  "response.speak"(call, e) {
    addUnit(call, "speak", e);
  },
  "session.metrics"(call, e) {
    hooks.metrics = e.metrics ?? e;
  },
  "session.paused"(call) {
    call.player?.flush();
    call.setState("paused");
  },
  "session.resumed"(call) {
    call.setState("live");
  },
  "session.replaced"(call) {
    call.ui.notice("This call continues in another window or tab.", "info");
    call.teardown("replaced", "Another window took this call over.");
  },
  "session.closed"(call, e) {
    hooks.closeReason = e.reason ?? null;
    call.teardown("closed", e.reason ? `Reason: ${e.reason.replaceAll("_", " ")}` : "");
  },
  error(call, e) {
    const err = e.error ?? {};
    hooks.errors.push({ code: err.code, type: err.type, message: err.message });
    if (hooks.errors.length > 50) hooks.errors.shift();
    // Persona and voice are fixed once audio began: on a takeover the server keeps the running
    // session's persona, which is what the user wants, so this is only worth a quiet note.
    const quiet = ["persona_update_unsupported", "voice_update_unsupported", "session_not_ready"].includes(err.code);
    call.ui.notice(quiet ? `Note: ${err.message}` : `Error (${err.code}): ${err.message}`, quiet ? "info" : "error");
    if (err.code === "resource_exhausted") call.teardown("failed", "All slots are busy and the queue is full.");
  },
};

function addUnit(call, kind, e) {
  const unit = { kind, unit: e.unit ?? hooks.units.length, endOfTurn: Boolean(e.end_of_turn) };
  hooks.units.push(unit);
  if (hooks.units.length > 200) hooks.units.shift();
  call.ui.addUnit(unit);
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

function fmt(ms) {
  if (!Number.isFinite(ms)) return null;
  return ms < 10 ? `${ms.toFixed(1)} ms` : `${Math.round(ms)} ms`; // sub-ms ticks of small engines still show
}

// ---- wiring -------------------------------------------------------------------------------------

const ui = new CallUi();
const call = new Call(ui);
ui.bind({
  start: () => call.start(),
  pause: () => call.pause(),
  resume: () => call.resume(),
  stop: () => call.stop(),
  cancel: () => call.cancel(),
  forceListen: () => call.forceListen(),
  camera: () => call.toggleCamera(),
});
// A saved persona fills the text box; the text box is what is sent, so it can still be edited.
document.getElementById("persona-preset")?.addEventListener("change", (event) => {
  const option = event.target.selectedOptions[0];
  document.getElementById("persona").value = option?.dataset.instructions ?? "";
});
// Show the default engine's banner before the first call (rendered by the server into the page).
const preview = document.getElementById("capabilities-preview");
if (preview) ui.setCapabilities(JSON.parse(preview.textContent));
