// Dedicated Worker: the call's /v1/realtime WebSocket, off the page's main thread.
//
// Audio never waits for the main thread: microphone pieces come from the mic worklet on a MessagePort
// and go out on the socket from here; the agent's audio goes from here to the player worklet on another
// port. A main-thread stall (layout, drawing, GC, a busy tab) used to delay one uplink piece and one
// downlink chunk at once, heard as an underrun (bench/notes/latency.md, 6885243). The page gets the JSON
// events, and a summary of the audio for its figures.
//
// Messages from the page: {type: "connect", url} | {type: "send", text} | {type: "mic", port} |
// {type: "player", port} | {type: "gate", uplink, downlink} | {type: "close", code}.
// To the page: {type: "open"} | {type: "event", text} | {type: "audio", samples, sumSquares, viaEvent} |
// {type: "mic", rms, time, samples, sent, sentAt} | {type: "error", code, message} | {type: "closed", code}.

import { base64ToInt16, decodeAudioFrame, encodeAudioFrame } from "./audio-wire.js";

let socket = null;
let player = null; // MessagePort to the player worklet
let uplink = false; // the page's state is live: microphone pieces go out
let downlink = false; // live or prefilling: the agent's audio is played
let received = 0; // output samples received on this connection (the server's heard_output_samples counts the same)
let micSent = 0; // microphone samples sent on this connection
let micSentTime = null; // the context time of the last sent sample
const MIC_RATE = 24000; // the mic worklet's pieces (mic-worklet.js OUTPUT_RATE)

const post = (message) => self.postMessage(message);

self.onmessage = ({ data }) => {
  switch (data.type) {
    case "connect":
      connect(data.url);
      break;
    case "send":
      if (socket?.readyState === WebSocket.OPEN) socket.send(data.text);
      break;
    case "mic":
      data.port.onmessage = ({ data: piece }) => onMicPiece(piece);
      break;
    case "player":
      player = data.port;
      player.onmessage = ({ data: message }) => onPlayerMessage(message);
      break;
    case "gate":
      uplink = data.uplink;
      downlink = data.downlink;
      break;
    case "close":
      if (socket && socket.readyState <= WebSocket.OPEN) socket.close(data.code);
      else self.close();
      break;
  }
};

function connect(url) {
  socket = new WebSocket(url); // the session cookie authenticates, as on the page
  socket.binaryType = "arraybuffer"; // audio frames (audio-wire.js); a Blob would cost an async read each
  socket.onopen = () => post({ type: "open" });
  socket.onmessage = ({ data }) => (data instanceof ArrayBuffer ? onBinary(data) : onText(data));
  socket.onclose = (event) => {
    post({ type: "closed", code: event.code });
    self.close();
  };
}

function onBinary(buffer) {
  const pcm = decodeAudioFrame(buffer);
  if (pcm) play(pcm, false);
  else post({ type: "error", code: "client_bad_frame", message: `binary frame of ${buffer.byteLength} bytes` });
}

// Audio deltas in JSON (stock clients' encoding, and what the server sends before it has applied
// duplex.binary_audio) are played from here too, so that the output sample count stays in one place.
const AUDIO_DELTA = '"response.output_audio.delta"';

function onText(text) {
  if (text.includes(AUDIO_DELTA)) {
    let event = null;
    try {
      event = JSON.parse(text);
    } catch {
      // not JSON after all: the page reports it
    }
    if (event?.type === "response.output_audio.delta") {
      try {
        play(base64ToInt16(event.delta ?? ""), true);
      } catch (err) {
        post({ type: "error", code: "client_bad_event", eventType: event.type, message: String(err) });
      }
      return;
    }
  }
  post({ type: "event", text });
}

function play(pcm, viaEvent) {
  received += pcm.length;
  let sumSquares = 0;
  for (let i = 0; i < pcm.length; i++) sumSquares += (pcm[i] / 32768) ** 2;
  post({ type: "audio", samples: pcm.length, sumSquares, viaEvent });
  // Audio still in flight when the user paused must not play after the pause.
  if (downlink && player) player.postMessage({ pcm, end: received }, [pcm.buffer]);
}

function onMicPiece({ frame, rms, time }) {
  // Only a live session takes audio: queued or prefilling sessions would answer session_not_ready,
  // and a paused slot is frozen, not fed.
  const sent = uplink && socket?.readyState === WebSocket.OPEN;
  if (sent) {
    socket.send(encodeAudioFrame(frame));
    micSent += frame.length;
    micSentTime = time;
  }
  post({ type: "mic", rms, time, samples: frame.length, sent, sentAt: performance.timeOrigin + performance.now() });
}

function onPlayerMessage({ ack, heard }) {
  if (ack === undefined || socket?.readyState !== WebSocket.OPEN) return;
  const event = { type: "playback.ack", played_ms: ack };
  if (micSentTime !== null && heard?.length) {
    // Where the microphone stream stood at each instant the player names: the pieces are contiguous in
    // time, so counted from the latest one sent (the next is still filling), at the wire rate.
    const at = (time) => Math.max(0, micSent + Math.round((time - micSentTime) * MIC_RATE));
    event.heard = heard.map(([time, output]) => [at(time), output]);
  }
  socket.send(JSON.stringify(event));
}
