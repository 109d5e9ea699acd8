// The call over WebRTC (POST /v1/realtime/calls, OpenAI's GA flow): the microphone rides an Opus track up,
// the agent's voice an Opus track down (the browser's jitter buffer, loss concealment and echo canceller),
// and the session's events the "oai-events" data channel, the same events as the WebSocket's.
// The same surface as transport.js, so the call page drives either; `onUnavailable` reports a WebRTC that
// could not be set up (signalling refused by the network, ICE failed or timed out) before the session
// began, which is when the page may fall back to the WebSocket.

import { pushBounded, hooks } from "./hooks.js";

const CONNECT_TIMEOUT_MS = 8000; // ICE + DTLS + the data channel; a blocked UDP path fails here
// The server's refusals of the offer, as the WebSocket's close codes (call.js says them in words).
const REFUSAL_CODES = { 401: 4401, 403: 4401, 429: 4429 };

export class RtcTransport {
  /**
   * @param {object} handlers transport.js's handlers plus onUnavailable(reason) and onRemoteStream(stream)
   * @param {{iceServers: RTCIceServer[], csrfToken: string}} options
   */
  constructor(handlers, { iceServers, csrfToken }) {
    this.handlers = handlers;
    this.open = false;
    this.csrfToken = csrfToken;
    this.pc = new RTCPeerConnection({ iceServers });
    this.channel = this.pc.createDataChannel("oai-events");
    this.channel.onopen = () => this.onOpen();
    this.channel.onmessage = ({ data }) => this.handlers.onEvent(data);
    this.channel.onclose = () => this.finish(1006);
    this.pc.ontrack = ({ streams, track }) => this.handlers.onRemoteStream(streams[0] ?? new MediaStream([track]));
    this.pc.onconnectionstatechange = () => {
      if (this.pc?.connectionState === "failed") this.unavailableOrClosed("ICE failed: no network path");
    };
    this.timer = null;
    this.sender = null;
  }

  /** Offer, POST, answer. `micStream` is the microphone (none in chat mode: receive-only audio). */
  async connect(url, micStream) {
    const track = micStream?.getAudioTracks()[0];
    if (track) this.sender = this.pc.addTransceiver(track, { direction: "sendrecv", streams: [micStream] }).sender;
    else this.pc.addTransceiver("audio", { direction: "recvonly" });
    this.timer = setTimeout(() => this.unavailableOrClosed("timed out connecting"), CONNECT_TIMEOUT_MS);
    let response;
    try {
      await this.pc.setLocalDescription(await this.pc.createOffer());
      response = await fetch(url, {
        method: "POST",
        body: this.pc.localDescription.sdp,
        headers: { "Content-Type": "application/sdp", "X-CSRFToken": this.csrfToken },
        credentials: "same-origin",
      });
    } catch (err) {
      this.unavailableOrClosed(`the offer could not be sent (${err.message})`);
      return;
    }
    if (!this.pc) return;
    if (response.status !== 201) {
      const error = (await response.json().catch(() => ({}))).error ?? {};
      if (REFUSAL_CODES[response.status]) {
        this.handlers.onError({ code: error.code ?? "refused", message: error.message ?? response.statusText });
        this.finish(REFUSAL_CODES[response.status]);
      } else {
        this.unavailableOrClosed(`the server answered ${response.status} (${error.code ?? "no code"})`);
      }
      return;
    }
    hooks.rtcCallId = (response.headers.get("Location") ?? "").split("/").pop() || null;
    await this.pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
  }

  onOpen() {
    clearTimeout(this.timer);
    this.open = true;
    this.handlers.onOpen();
  }

  /** Before the data channel opened the page may try the WebSocket instead; after, it is a dropped call. */
  unavailableOrClosed(reason) {
    if (!this.pc) return;
    if (this.open) {
      this.finish(1006);
      return;
    }
    this.close();
    this.handlers.onUnavailable(reason);
  }

  finish(code) {
    if (!this.pc) return;
    this.close();
    this.handlers.onClose(code);
  }

  send(event) {
    if (!this.open || this.channel?.readyState !== "open") return false;
    this.channel.send(JSON.stringify(event));
    return true;
  }

  /** The microphone goes up only while live (the server drops it otherwise too): a disabled track is silence. */
  gate({ uplink }) {
    if (this.sender?.track) this.sender.track.enabled = uplink && !hooks.muted;
  }

  /** The inbound audio's figures from the browser's WebRTC stack (inbound-rtp), for the page's figures. */
  async stats() {
    if (!this.pc) return null;
    const report = await this.pc.getStats();
    let inbound = null;
    let rttMs = null;
    report.forEach((entry) => {
      if (entry.type === "inbound-rtp" && entry.kind === "audio") inbound = entry;
      if (entry.type === "candidate-pair" && entry.nominated && entry.currentRoundTripTime !== undefined) {
        rttMs = entry.currentRoundTripTime * 1000;
      }
    });
    if (!inbound) return { rttMs };
    const emitted = inbound.jitterBufferEmittedCount || 0;
    return {
      rttMs,
      packetsReceived: inbound.packetsReceived ?? 0,
      packetsLost: inbound.packetsLost ?? 0,
      playedMs: (inbound.totalSamplesDuration ?? 0) * 1000,
      // RMS from the energy the browser measured over what it played out
      rms: inbound.totalSamplesDuration ? Math.sqrt((inbound.totalAudioEnergy ?? 0) / inbound.totalSamplesDuration) : 0,
      bufferMs: emitted ? (inbound.jitterBufferDelay / emitted) * 1000 : 0,
      concealmentEvents: inbound.concealmentEvents ?? 0,
      concealedMs: inbound.clockRate ? ((inbound.concealedSamples ?? 0) / inbound.clockRate) * 1000 : 0,
    };
  }

  close() {
    clearTimeout(this.timer);
    const pc = this.pc;
    this.pc = null;
    this.open = false;
    if (!pc) return;
    try {
      this.channel?.close();
      pc.close();
    } catch (err) {
      pushBounded(hooks.errors, { code: "client_rtc_close", message: String(err) }, 50);
    }
  }
}

/** The agent's voice from the remote track: played by an <audio> element (where the browser's echo
 * canceller applies to WebRTC playback), analysed in the page's AudioContext for the waveform and levels. */
export class RtcPlayer {
  constructor(ctx) {
    this.ctx = ctx;
    this.element = new Audio();
    this.element.autoplay = true;
    this.gain = ctx.createGain(); // not connected to the speakers: the element plays
    this.analyser = ctx.createAnalyser();
    this.analyser.fftSize = 2048;
    this.gain.connect(this.analyser);
    this.volume = { gain: { value: 1 } }; // call.js sets the volume here; setVolume applies it
    this.stats = { underruns: 0, overruns: 0, grows: 0, shrinks: 0, playedMs: 0, slipDroppedMs: 0 };
    this.targetMs = 0;
    this.depthMs = 0;
    this.playedRms = 0;
    this.source = null;
  }

  attach(stream) {
    this.element.srcObject = stream;
    this.element.play().catch((err) => pushBounded(hooks.errors, { code: "client_autoplay", message: String(err) }, 50));
    this.source?.disconnect();
    this.source = this.ctx.createMediaStreamSource(stream);
    this.source.connect(this.gain);
  }

  setVolume(volume) {
    this.element.volume = volume;
  }

  async setSinkId(deviceId) {
    await this.element.setSinkId?.(deviceId);
  }

  /** The browser's figures (RtcTransport.stats) as the jitter player's. */
  update(figures) {
    if (!figures || figures.playedMs === undefined) return;
    this.stats.playedMs = figures.playedMs;
    this.stats.underruns = figures.concealmentEvents;
    this.depthMs = figures.bufferMs;
    this.targetMs = figures.bufferMs;
    this.playedRms = figures.rms;
  }

  flush() {} // nothing waits on the page: the browser's jitter buffer holds tens of ms

  close() {
    this.source?.disconnect();
    this.element.srcObject = null;
  }
}
