// The call page's controller: microphone -> /v1/realtime -> jitter buffer, and the session's state.
//
// Protocol: docs/protocol.md (OpenAI Realtime events plus Parley's duplex extensions). Audio goes
// up as binary frames of pcm16 at 24 kHz in 20 ms pieces; the agent's audio comes down as binary
// frames too once the session has `duplex.binary_audio` (audio-wire.js).
// The DOM is ui.js's, server events are server-events.js's, and the test hooks (hooks.js) are
// a one-way window onto all of it.

import { hooks, installTap, pushBounded } from "./hooks.js";
import { decodeAudioFrame, encodeAudioFrame } from "./audio-wire.js";
import { JitterPlayer, WIRE_RATE } from "./player.js";
import { LatencyMeter } from "./latency.js";
import { bindChat, handleChatEvent } from "./chat.js";
import { applyMode, chosenMode, handleModeEvent } from "./modes.js";
import { handleServerEvent, playAgentAudio } from "./server-events.js";
import { CallUi } from "./ui.js";

const params = new URLSearchParams(location.search);
// Tests (and people debugging levels) pass ?raw=1: the browser's echo canceller, noise
// suppressor and gain control would otherwise reshape the fake microphone's signal.
const RAW_AUDIO = params.get("raw") === "1";
const MODEL = params.get("model");
// Latency measurement (tests, bench/latency_browser.py): ?tap=1 records mic and output, see hooks.js.
const TAP = params.get("tap") === "1";
// The AudioContext's latency hint: 0 unless the page is asked for another (?latency_hint=seconds, or a
// category such as "interactive"). 0 gets headless chromium's smallest output buffer (12 ms reported
// against 40 for "interactive"). With it a starved audio thread loses clock time more often, and each
// loss used to stay on as delay (the drift of d9c2c76's clean-clone runs); the jitter buffer now drops
// what arrived for the lost time (player.js, traced in bench/notes/latency.md, stop 24).
const DEFAULT_LATENCY_HINT = 0;
// ?slip_drop=0 keeps the audio the jitter buffer would drop for the audio clock's slip (an A/B lever for
// bench/latency_browser.py --stall-audio-ms; see player.js).
const DROP_SLIP = params.get("slip_drop") !== "0";
// ?jitter_margin_ms=N: the jitter buffer's slack above the worst arrival (player.js MARGIN_MS), for A/B runs.
const JITTER_MARGIN_MS = Number.parseFloat(params.get("jitter_margin_ms")) || undefined;
const LATENCY_HINT = (() => {
  const asked = params.get("latency_hint");
  if (asked === null) return DEFAULT_LATENCY_HINT;
  const seconds = Number.parseFloat(asked);
  if (Number.isFinite(seconds) && seconds >= 0) return seconds;
  return ["interactive", "balanced", "playback"].includes(asked) ? asked : DEFAULT_LATENCY_HINT; // else the default
})();

export class Call {
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
    this.figuresTimer = null;
    this.meter = null; // measured mouth-to-ear, see latency.js
    this.startedAt = 0; // performance.now() when Start was pressed
    this.receivedMsAtStart = 0;
  }

  setState(state, detail = "") {
    if (this.state !== state) pushBounded(hooks.stateHistory, state, 100);
    this.state = state;
    hooks.state = state;
    this.ui.setState(state, detail);
  }

  // ---- user actions --------------------------------------------------------------------------

  /** Start (or reconnect). Runs inside the click handler: autoplay rules want the AudioContext made here. */
  async start() {
    this.startedAt = performance.now();
    hooks.firstAudioMs = null;
    this.ctx = new AudioContext({ latencyHint: LATENCY_HINT });
    const resuming = this.ctx.resume(); // still inside the user gesture
    this.setState("connecting");
    this.ui.notice("");
    try {
      await resuming;
      await this.ctx.audioWorklet.addModule(new URL("./mic-worklet.js", import.meta.url));
      if (chosenMode() !== "chat") await this.openMicrophone(); // chat takes typed messages, no stream
    } catch (err) {
      this.fail(`Microphone unavailable: ${err.message}`);
      return;
    }
    this.meter = new LatencyMeter(this.ctx);
    this.receivedMsAtStart = hooks.audioMsReceived;
    this.player = new JitterPlayer(this.ctx, {
      rate: WIRE_RATE,
      onAck: (ms) => this.send({ type: "playback.ack", played_ms: ms }),
      onStart: (chunk) => this.onChunkScheduled(chunk),
      dropSlip: DROP_SLIP,
      marginMs: JITTER_MARGIN_MS,
    });
    this.ui.drawOutput(this.player.analyser);
    if (TAP && this.mic) await installTap(this.ctx, this.mic.source, this.player.gain);
    hooks.framesSent = 0;
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
      const video = this.ui.cameraPreview();
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
    node.port.onmessage = ({ data }) => this.onMicFrame(data.frame, data.rms, data.time);
    source.connect(node); // the worklet runs while an input is connected; no need to reach the speakers
    this.mic = { stream, source, node };
  }

  onMicFrame(frame, rms, time) {
    hooks.micRms = rms;
    this.ui.setMicLevel(rms);
    // Only a live session takes audio: queued or prefilling sessions would answer session_not_ready,
    // and a paused slot is frozen, not fed.
    if (this.state !== "live") return;
    if (this.sendBinary(encodeAudioFrame(frame))) {
      hooks.framesSent++;
      this.meter.noteSent(frame.length, time);
    }
  }

  /** The player scheduled an agent chunk: note when it plays, and time the first one after Start. */
  onChunkScheduled({ at, duration }) {
    const received = Math.round(((hooks.audioMsReceived - this.receivedMsAtStart) * WIRE_RATE) / 1000);
    this.meter.noteScheduled(received, at, duration);
    if (hooks.firstAudioMs === null) {
      const output = (this.ctx.baseLatency ?? 0) + (this.ctx.outputLatency ?? 0);
      hooks.firstAudioMs = performance.now() - this.startedAt + (at - this.ctx.currentTime + output) * 1000;
      this.ui.setFigures({ first_audio: fmt(hooks.firstAudioMs) });
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
        const image = new Uint8Array(await blob.arrayBuffer()).toBase64();
        if (this.send({ type: "input_image.append", image })) hooks.imagesSent++;
      },
      "image/jpeg",
      0.8,
    );
  }

  // ---- socket --------------------------------------------------------------------------------

  connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const params = new URLSearchParams();
    if (MODEL) params.set("model", MODEL);
    // A chat call asks for chat at connect (extension): it is admitted at once, holding no engine slot.
    if (chosenMode() === "chat") params.set("mode", "chat");
    const query = params.size ? `?${params}` : "";
    const ws = new WebSocket(`${scheme}://${location.host}/v1/realtime${query}`); // the session cookie authenticates
    ws.binaryType = "arraybuffer"; // audio frames (audio-wire.js); a Blob would cost an async read each
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
    const session = { type: "realtime", audio: { input: { format: { type: "audio/pcm", rate: WIRE_RATE } } } };
    const persona = this.ui.persona();
    const personaId = this.ui.personaId();
    const voice = this.ui.voice();
    if (!resumed && persona) session.instructions = persona;
    // A saved persona, unedited, also goes by id (the server prefers it): the session names the persona version.
    if (!resumed && personaId) session.duplex = { persona_id: Number(personaId) };
    if (!resumed && voice) session.audio.output = { voice };
    session.duplex = { ...session.duplex, binary_audio: true }; // per connection: a resumed call asks again
    this.send({ type: "session.update", session: applyMode(session, resumed) });
  }

  send(event) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(event));
    return true;
  }

  sendBinary(frame) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(frame);
    return true;
  }

  onMessage(data) {
    if (data instanceof ArrayBuffer) {
      const pcm = decodeAudioFrame(data);
      if (pcm) playAgentAudio(this, pcm);
      else pushBounded(hooks.errors, { code: "client_bad_frame", message: `binary frame of ${data.byteLength} bytes` }, 50);
      return;
    }
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      pushBounded(hooks.errors, { code: "client_invalid_json", message: String(data).slice(0, 200) }, 50);
      return;
    }
    hooks.eventCounts[event.type] = (hooks.eventCounts[event.type] ?? 0) + 1;
    try {
      handleServerEvent(this, event);
      handleModeEvent(event, this); // the mode picker and the half-duplex speech indicator (modes.js)
      handleChatEvent(event, this); // chat mode's box and log (chat.js)
    } catch (err) {
      // A malformed event (bad base64, missing fields) is dropped; the call goes on.
      pushBounded(hooks.errors, { code: "client_bad_event", type: event.type, message: String(err) }, 50);
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

  refreshFigures() {
    const player = this.player;
    if (player) {
      hooks.playedRms = player.playedRms;
      hooks.playedMs = player.stats.playedMs;
      hooks.bufferMs = player.depthMs;
      hooks.underruns = player.stats.underruns;
      hooks.overruns = player.stats.overruns;
      hooks.jitter = {
        targetMs: player.targetMs,
        grows: player.stats.grows,
        shrinks: player.stats.shrinks,
        slipDroppedMs: player.stats.slipDroppedMs, // dropped because the audio clock fell behind the wall
      };
    }
    if (this.ctx) {
      // The audio clock against the page's: a starved audio thread makes contextMs fall behind performanceMs.
      hooks.audioClock = { contextMs: this.ctx.currentTime * 1000, performanceMs: performance.now() };
    }
    const m = hooks.metrics ?? {};
    const mouthToEar = this.meter?.measure(m) ?? null;
    hooks.mouthToEarMs = mouthToEar;
    hooks.latencyParts = this.meter?.parts ?? null;
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
ui.bindPersonaPresets();
bindChat(call);
ui.showPreview(); // the default engine's banner, before the first call
