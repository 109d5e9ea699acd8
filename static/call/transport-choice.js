// Which transport a call uses, and saying so on the page: WebRTC when the browser has it, else the WebSocket.
// The picker (#transport-choice) or ?transport=auto|webrtc|websocket chooses; "auto" falls back to the
// WebSocket when WebRTC cannot be set up, "webrtc" does not. Chat mode (typed messages, no audio stream)
// always uses the WebSocket.

import { hooks } from "./hooks.js";

const CHOICES = ["auto", "webrtc", "websocket"];

export function chosenTransport() {
  return document.getElementById("transport-choice")?.value || "auto";
}

/** Whether to try WebRTC for this call: {ok, why} (why: the reason it is the WebSocket instead). */
export function wantsWebRtc(mode) {
  const choice = chosenTransport();
  if (choice === "websocket") return { ok: false, why: "chosen" };
  if (mode === "chat") return { ok: false, why: "chat mode" };
  if (typeof RTCPeerConnection !== "function") return { ok: false, why: "this browser has no WebRTC" };
  return { ok: true, why: "" };
}

/** Show the transport in use; `why` says why it is not WebRTC. */
export function showTransport(kind, why = "") {
  hooks.transport = kind;
  hooks.transportNote = why || null;
  const shown = document.getElementById("transport-shown");
  if (shown) shown.textContent = kind === "webrtc" ? "WebRTC" : why ? `WebSocket (${why})` : "WebSocket";
}

/** The picker starts at ?transport= when it names a choice. */
export function bindTransportPicker(params) {
  const picker = document.getElementById("transport-choice");
  const asked = params.get("transport");
  if (picker && CHOICES.includes(asked)) picker.value = asked;
}
