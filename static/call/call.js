// The call page's controller: microphone -> /v1/realtime -> jitter buffer, and the session's state.
// Over WebRTC when it can (rtc-transport.js: Opus tracks and the oai-events data channel, the same events),
// else, or when asked (?transport=websocket, the picker), over the WebSocket described below.
//
// Protocol: docs/protocol.md (OpenAI Realtime events plus Parley's duplex extensions). Audio goes
// up as binary frames of pcm16 at 24 kHz in 20 ms pieces; the agent's audio comes down as binary
// frames too once the session has `duplex.binary_audio` (audio-wire.js).
// Audio never passes through this thread: the socket lives in a Worker (transport.js), which the mic
// worklet feeds and which feeds the player worklet, each over a MessagePort. This thread handles the
// events, the state and the drawing.
// The DOM is ui.js's, server events are server-events.js's, the figures figures.js's, the camera
// camera.js's, and the test hooks (hooks.js) are a one-way window onto all of it.

import { countEvent, hooks, installEchoLoop, installTap, pushBounded } from "./hooks.js";
import { JitterPlayer, WIRE_RATE } from "./player.js";
import { LatencyMeter } from "./latency.js";
import { bindChat, handleChatEvent } from "./chat.js";
import { stopCamera, toggleCamera } from "./camera.js";
import { CAN_PICK_SPEAKER, fillDevicePicker, microphoneProblem } from "./devices.js";
import { CLOSE_REFUSALS } from "./close-reasons.js";
import { describeStart, fmt, refreshFigures } from "./figures.js";
import { applyMode, chosenMode, handleModeEvent } from "./modes.js";
import { handleServerEvent, noteAgentAudio } from "./server-events.js";
import { Transport } from "./transport.js";
import { RtcPlayer, RtcTransport } from "./rtc-transport.js";
import { bindTransportPicker, chosenTransport, showTransport, wantsWebRtc } from "./transport-choice.js";
import { CallUi } from "./ui.js";
import { waitForAgent } from "./warm-start.js";

const params = new URLSearchParams(location.search);
// Tests (and people debugging levels) pass ?raw=1: the browser's echo canceller, noise
// suppressor and gain control would otherwise reshape the fake microphone's signal.
const RAW_AUDIO = params.get("raw") === "1";
const MODEL = params.get("model");
// Latency measurement (tests, bench/latency_browser.py): ?tap=1 records mic and output, see hooks.js.
const TAP = params.get("tap") === "1";
// Tests of the echo warning (tests/browser/test_echo_loop.py): ?test_echo_loop=DB,MS feeds the agent's
// played audio back into the microphone's path DB decibels down after MS milliseconds, as speakers
// heard by the microphone would (see hooks.js installEchoLoop). Never set by the page itself.
const ECHO_LOOP = params.get("test_echo_loop");
// The AudioContext's latency hint: 0 unless the page is asked for another (?latency_hint=seconds, or a
// category such as "interactive"). 0 gets headless chromium's smallest output buffer (12 ms reported
// against 40 for "interactive"). With it a starved audio thread loses clock time more often, and each
// loss used to stay on as delay (the drift of d9c2c76's clean-clone runs); the jitter buffer now drops
// what arrived for the lost time (player-worklet.js, traced in bench/notes/latency.md, 6942395).
const DEFAULT_LATENCY_HINT = 0;
// ?slip_drop=0 keeps the audio the jitter buffer would drop for the audio clock's slip (an A/B lever for
// bench/latency_browser.py --stall-audio-ms; see player-worklet.js).
const DROP_SLIP = params.get("slip_drop") !== "0";
// ?jitter_margin_ms=N: the jitter buffer's slack above the worst arrival (player-worklet.js MARGIN_MS), for A/B runs.
const JITTER_MARGIN_MS = Number.parseFloat(params.get("jitter_margin_ms")) || undefined;
// Pieces are 20 ms apart; a longer pause between two sent while live is noted (hooks.uplinkGaps).
const UPLINK_GAP_MS = 50;
const ICE_SERVERS = JSON.parse(document.getElementById("ice-servers")?.textContent || "[]");
const CSRF_TOKEN = document.querySelector(".call-page")?.dataset.csrfToken ?? "";
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
    this.transport = null; // the socket, in its Worker (transport.js)
    this.player = null;
    this.mic = null; // {stream, source, node}
    this.camera = null; // {stream, video, timer} (camera.js)
    this.state = "idle";
    this.receivedSumSquares = 0;
    this.receivedSamples = 0;
    this.figuresTimer = null;
    this.meter = null; // measured mouth-to-ear, see latency.js
    this.startedAt = 0; // performance.now() when Start was pressed
    this.lastSentAt = null; // when the previous microphone piece went out (ms since the time origin)
    this.muted = false;
    this.volume = 1;
  }

  /** Milliseconds since Start was pressed (the transcript's times). */
  sinceStart() {
    return performance.now() - this.startedAt;
  }

  /** Note how long after Start one step of the start was done (hooks.startTimeline), once per call. */
  markStart(step) {
    if (hooks.startTimeline && !(step in hooks.startTimeline)) {
      hooks.startTimeline[step] = Math.round(performance.now() - this.startedAt);
    }
  }

  setState(state, detail = "") {
    if (this.state !== state) pushBounded(hooks.stateHistory, state, 100);
    this.state = state;
    hooks.state = state;
    // Only a live session takes audio: queued or prefilling sessions would answer session_not_ready, and a
    // paused slot is frozen, not fed. Audio still in flight when the user paused must not play after the pause.
    this.transport?.gate({ uplink: state === "live", downlink: state === "live" || state === "prefilling" });
    if (state !== "live") this.lastSentAt = null; // a pause is not an uplink gap
    this.ui.setState(state, detail);
  }

  // ---- user actions --------------------------------------------------------------------------

  /** Start (or reconnect). Runs inside the click handler: autoplay rules want the AudioContext made here. */
  async start() {
    this.startedAt = performance.now();
    hooks.firstAudioMs = null;
    hooks.startTimeline = {};
    this.ctx = new AudioContext({ latencyHint: LATENCY_HINT });
    const resuming = this.ctx.resume(); // still inside the user gesture
    const speaker = document.getElementById("speaker-device").value;
    this.setState("connecting");
    this.ui.notice("");
    try {
      await resuming;
      await this.ctx.audioWorklet.addModule(new URL("./mic-worklet.js", import.meta.url));
      if (chosenMode() !== "chat") await this.openMicrophone(); // chat takes typed messages, no stream
      this.markStart("microphone");
    } catch (err) {
      this.fail(microphoneProblem(err));
      return;
    }
    refreshDevicePickers(); // with the microphone allowed, devices have names
    this.meter = new LatencyMeter(this.ctx);
    this.speaker = speaker;
    const rtc = wantsWebRtc(chosenMode());
    if (rtc.ok) this.player = new RtcPlayer(this.ctx);
    else if (!(await this.makeJitterPlayer())) return;
    await this.outputReady();
    hooks.framesSent = 0;
    this.lastSentAt = null;
    if (rtc.ok) this.connectRtc();
    else this.connect(rtc.why);
    this.figuresTimer = setInterval(() => refreshFigures(this), 500);
  }

  async makeJitterPlayer() {
    try {
      this.player = await JitterPlayer.create(this.ctx, {
        onStart: (chunk) => this.onChunkScheduled(chunk),
        dropSlip: DROP_SLIP,
        marginMs: JITTER_MARGIN_MS,
      });
      return true;
    } catch (err) {
      this.fail(`Audio output unavailable: ${err.message}`);
      return false;
    }
  }

  async outputReady() {
    this.markStart("player");
    this.setVolume(this.volume);
    if (this.speaker) await this.chooseSpeaker(this.speaker);
    this.ui.drawOutput(this.player.analyser);
    if (TAP && this.mic) await installTap(this.ctx, this.mic.source, this.player.gain);
    if (ECHO_LOOP && this.mic) installEchoLoop(this.ctx, this.player.gain, this.mic.node, ECHO_LOOP);
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

  /** Mute: the microphone's track is disabled, so the call goes on with silence going up. */
  toggleMute() {
    this.muted = !this.muted;
    this.mic?.stream.getAudioTracks().forEach((track) => (track.enabled = !this.muted));
    hooks.muted = this.muted;
    this.ui.setMuted(this.muted);
  }

  setVolume(volume) {
    this.volume = volume;
    hooks.outputVolume = volume;
    if (this.player?.setVolume) this.player.setVolume(volume);
    else if (this.player) this.player.volume.gain.value = volume;
    this.ui.showVolume(volume);
  }

  /** Send the agent's audio to another output device (where the browser can). */
  async chooseSpeaker(deviceId) {
    if (!this.ctx || !CAN_PICK_SPEAKER) return;
    try {
      await this.ctx.setSinkId(deviceId);
      await this.player?.setSinkId?.(deviceId); // over WebRTC an <audio> element plays the agent
      hooks.speakerId = deviceId;
    } catch (err) {
      this.ui.notice(`That speaker could not be used: ${err.message}`, "error");
    }
  }

  forceListen() {
    this.send({ type: "response.force_listen" });
  }

  // ---- audio in ------------------------------------------------------------------------------

  async openMicrophone() {
    const deviceId = document.getElementById("mic-device").value;
    const constraints = {
      ...(deviceId ? { deviceId: { exact: deviceId } } : {}),
      channelCount: 1,
      echoCancellation: !RAW_AUDIO,
      noiseSuppression: !RAW_AUDIO,
      autoGainControl: !RAW_AUDIO,
    };
    const stream = await navigator.mediaDevices.getUserMedia({ audio: constraints });
    stream.getAudioTracks().forEach((track) => (track.enabled = !this.muted)); // muted before Start stays muted
    const source = this.ctx.createMediaStreamSource(stream);
    const node = new AudioWorkletNode(this.ctx, "parley-mic", { numberOfInputs: 1, numberOfOutputs: 0 });
    // Until the socket's Worker takes the pieces (connect), only their level is shown.
    node.port.onmessage = ({ data }) => this.showMicLevel(data.rms);
    source.connect(node); // the worklet runs while an input is connected; no need to reach the speakers
    this.mic = { stream, source, node };
  }

  showMicLevel(rms) {
    hooks.micRms = rms;
    this.ui.setMicLevel(rms);
  }

  /** The socket's Worker handled one microphone piece (sent it when the call is live). */
  onMicPiece({ rms, time, samples, sent, sentAt }) {
    this.showMicLevel(rms);
    if (!sent || !this.ctx) return;
    hooks.framesSent++;
    // sentAt is on the shared wall clock (ms); the meter keeps context time
    const sentAgo = (performance.timeOrigin + performance.now() - sentAt) / 1000;
    const at = sentAt - performance.timeOrigin;
    if (this.lastSentAt !== null && at - this.lastSentAt > UPLINK_GAP_MS) {
      pushBounded(hooks.uplinkGaps, { at, ms: at - this.lastSentAt }, 50);
    }
    this.lastSentAt = at;
    this.meter.noteSent(samples, time, this.ctx.currentTime - sentAgo);
  }

  /** The player queued an agent chunk: note when it plays, and time the first one after Start. */
  onChunkScheduled({ end, at, duration, receivedAt }) {
    if (!this.ctx) return;
    this.meter.noteScheduled(end, at, duration, receivedAt);
    if (hooks.firstAudioMs === null) {
      const output = (this.ctx.baseLatency ?? 0) + (this.ctx.outputLatency ?? 0);
      hooks.firstAudioMs = performance.now() - this.startedAt + (at - this.ctx.currentTime + output) * 1000;
      this.markStart("first_chunk_queued");
      hooks.startTimeline.first_sound = Math.round(hooks.firstAudioMs);
      this.ui.setFigures({ first_audio: fmt(hooks.firstAudioMs) });
      this.ui.setFigureDetail("first_audio", describeStart(hooks.startTimeline));
    }
  }

  // ---- socket --------------------------------------------------------------------------------

  /** WebRTC: the microphone's track and the agent's go through the peer connection; events its data channel.
   * If it cannot be set up before the session begins (signalling blocked, ICE failing), the WebSocket is used. */
  connectRtc() {
    const transport = new RtcTransport(
      {
        onOpen: () => this.markStart("socket_open"),
        onEvent: (text) => this.onMessage(text),
        onError: (error) => pushBounded(hooks.errors, error, 50),
        onClose: (code) => this.onTransportClosed(transport, code),
        onRemoteStream: (stream) => this.player?.attach?.(stream),
        onUnavailable: (why) => this.fallBack(transport, why),
      },
      { iceServers: ICE_SERVERS, csrfToken: CSRF_TOKEN },
    );
    this.transport = transport;
    showTransport("webrtc");
    if (this.mic) {
      this.mic.node.port.onmessage = ({ data }) => {
        this.showMicLevel(data.rms);
        if (this.state === "live" && !this.muted) hooks.framesSent++;
      };
    }
    transport.gate({ uplink: false, downlink: false });
    transport.connect(`/v1/realtime/calls${this.connectQuery()}`, this.mic?.stream);
  }

  /** WebRTC could not be set up: the same call over the WebSocket, with a jitter player of the page's own. */
  async fallBack(transport, why) {
    if (this.transport !== transport || !this.ctx) return;
    this.transport = null;
    if (chosenTransport() === "webrtc") {
      this.fail(`WebRTC could not connect: ${why}. Choose "Automatic" or "WebSocket" to call anyway.`);
      return;
    }
    this.player?.close();
    if (!(await this.makeJitterPlayer())) return;
    await this.outputReady();
    this.connect(`WebRTC failed: ${why}`);
  }

  onTransportClosed(transport, code) {
    if (this.transport !== transport) return; // an old socket after a reconnect
    if (["closed", "replaced", "failed"].includes(this.state)) return;
    if (this.state === "closing") {
      // The caller pressed Stop and session.close went out: a socket that ends before the server's
      // confirmation arrives (a connection dropped on the way out, code 1006) is the call ending, not one to resume.
      this.teardown("closed", "Call ended; the connection closed before the server confirmed it.");
      return;
    }
    if (CLOSE_REFUSALS[code]) {
      this.teardown("failed", CLOSE_REFUSALS[code]); // refused or ended by the server: nothing to resume
      return;
    }
    this.teardown("disconnected", `The connection closed (code ${code}). Start again within 30 s to resume.`);
  }

  connectQuery() {
    const params = new URLSearchParams();
    if (MODEL) params.set("model", MODEL);
    // A chat call asks for chat at connect (extension): it is admitted at once, holding no engine slot.
    if (chosenMode() === "chat") params.set("mode", "chat");
    return params.size ? `?${params}` : "";
  }

  /** The WebSocket (`why`: the reason it is not WebRTC, shown beside the transport). */
  connect(why = "") {
    showTransport("websocket", why);
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = this.connectQuery();
    const transport = new Transport({
      onOpen: () => this.markStart("socket_open"),
      onEvent: (text) => this.onMessage(text),
      onAudio: (audio) => noteAgentAudio(this, audio),
      onMic: (piece) => this.onMicPiece(piece),
      onError: (error) => pushBounded(hooks.errors, error, 50),
      onClose: (code) => this.onTransportClosed(transport, code),
    });
    this.transport = transport;
    // The audio's own paths: mic worklet -> socket Worker -> player worklet, one MessagePort each.
    if (this.mic) {
      const uplink = new MessageChannel();
      this.mic.node.port.postMessage({ transport: uplink.port1 }, [uplink.port1]);
      transport.takeMicrophone(uplink.port2);
    }
    const downlink = new MessageChannel();
    this.player.feedFrom(downlink.port1);
    transport.feedPlayer(downlink.port2);
    transport.gate({ uplink: false, downlink: false });
    transport.connect(`${scheme}://${location.host}/v1/realtime${query}`); // the session cookie authenticates
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
    // The caller's own choice, kept in this browser: whether the camera frames the model saw are recorded.
    session.duplex.record_video = localStorage.getItem("parley.recordVideo") !== "off";
    this.send({ type: "session.update", session: applyMode(session, resumed) });
  }

  send(event) {
    return this.transport?.send(event) ?? false;
  }

  /** One JSON event from the server (audio deltas never come here: the socket's Worker plays them). */
  onMessage(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      pushBounded(hooks.errors, { code: "client_invalid_json", message: String(data).slice(0, 200) }, 50);
      return;
    }
    countEvent(event.type);
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
    stopCamera(this);
    if (this.mic) {
      this.mic.stream.getTracks().forEach((track) => track.stop());
      this.mic.source.disconnect();
      this.mic.node.port.onmessage = null;
      this.mic = null;
    }
    this.player?.flush();
    this.ui.stopDrawing();
    clearInterval(this.figuresTimer);
    refreshFigures(this);
    this.transport?.close(1000);
    this.transport = null;
    this.player?.close();
    this.ctx?.close();
    this.ctx = null;
    hooks.statusLines = {};
    this.ui.setServerStatus(""); // a warning about a call that has ended says nothing
    this.setState(state, detail);
  }

  /** Said once: in the notice (the state badge says "Failed" beside it). */
  fail(message) {
    this.teardown("failed", "");
    this.ui.notice(message, "error");
  }
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
  camera: () => toggleCamera(call),
});
ui.bindPersonaPresets(params);
bindTransportPicker(params);
const refreshDevicePickers = () => {
  fillDevicePicker(document.getElementById("mic-device"), "audioinput");
  if (CAN_PICK_SPEAKER) fillDevicePicker(document.getElementById("speaker-device"), "audiooutput");
};
ui.showSpeakerPicker(CAN_PICK_SPEAKER);
refreshDevicePickers();
navigator.mediaDevices?.addEventListener("devicechange", refreshDevicePickers);
document.getElementById("mute").addEventListener("click", () => call.toggleMute());
document.getElementById("volume").addEventListener("input", (event) => call.setVolume(Number(event.target.value)));
document.getElementById("speaker-device").addEventListener("change", (event) => call.chooseSpeaker(event.target.value));
bindChat(call);
ui.showPreview(); // the default engine's banner, before the first call
waitForAgent(call); // Start waits while the server still loads the engine
// Record video: the caller's own setting, kept in this browser and honoured by the server from the next frame.
const recordVideo = document.getElementById("record-video");
recordVideo.checked = localStorage.getItem("parley.recordVideo") !== "off";
recordVideo.addEventListener("change", () => {
  localStorage.setItem("parley.recordVideo", recordVideo.checked ? "on" : "off");
  if (call.state === "live" || call.state === "paused") {
    call.send({ type: "session.update", session: { type: "realtime", duplex: { record_video: recordVideo.checked } } });
  }
});
