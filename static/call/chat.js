// Chat mode on the call page: the chat box (a message and an attached PNG/JPEG image) and the
// conversation log, where each reply streams in as its transcript deltas arrive. The reply's audio
// plays through the call's player like any agent audio (server-events.js). call.js calls
// handleChatEvent() on every server event and bindChat() once.
//
// Protocol: conversation.item.create (input_text, input_image as a data URI) then response.create;
// docs/protocol.md, "Modes".

import { hooks, pushBounded } from "./hooks.js";

const $ = (id) => document.getElementById(id);

// What the page saw of the chat: messages sent, and each reply's id, status and text (bounded).
hooks.chat = { sent: 0, replies: [], current: "" };
let replyLine = null; // the log entry the running reply streams into

/** Wire the chat box's form to the call (which sends the events over its socket). */
export function bindChat(call) {
  $("chat-box")?.addEventListener("submit", (event) => {
    event.preventDefault();
    sendMessage(call).catch((err) => call.ui.notice(`Could not send: ${err.message}`, "error"));
  });
}

async function sendMessage(call) {
  const text = $("chat-text").value.trim();
  const file = $("chat-image").files?.[0] ?? null;
  if (!text && !file) return;
  const content = [];
  if (text) content.push({ type: "input_text", text });
  if (file) {
    const data = new Uint8Array(await file.arrayBuffer()).toBase64();
    content.push({ type: "input_image", image_url: `data:${file.type || "image/png"};base64,${data}` });
  }
  const item = { type: "message", role: "user", content };
  if (!call.send({ type: "conversation.item.create", item })) return;
  call.send({ type: "response.create" });
  hooks.chat.sent += 1;
  addLine("user", file ? `${text} [image: ${file.name}]`.trim() : text);
  $("chat-text").value = "";
  $("chat-image").value = "";
  $("chat-send").disabled = true; // until the reply is done (one response at a time)
}

function addLine(who, text) {
  const log = $("chat-log");
  const line = document.createElement("p");
  line.className = `chat-line chat-${who}`;
  const label = document.createElement("strong");
  label.textContent = who === "user" ? "You: " : "Agent: ";
  const body = document.createElement("span");
  body.textContent = text;
  line.append(label, body);
  log.append(line);
  while (log.childElementCount > 200) log.firstElementChild.remove();
  log.scrollTop = log.scrollHeight;
  return body;
}

function showChat(shown) {
  $("chat-box").hidden = !shown;
  $("chat-log").hidden = !shown;
  $("chat-send").disabled = false;
}

const HANDLERS = {
  "session.updated"(e) {
    showChat((e.session?.duplex?.mode ?? "duplex") === "chat");
  },
  "session.closed"() {
    $("chat-box").hidden = true;
    replyLine = null;
  },
  "session.queued"(e, call) {
    // A chat response waits for a free engine slot; the call itself is up.
    if (hooks.mode !== "chat" || !hooks.sessionId) return;
    call.setState("live");
    call.ui.notice(`Waiting for a free slot (position ${e.position})…`, "info");
  },
  "response.created"() {
    if (hooks.mode !== "chat") return;
    hooks.chat.current = "";
    replyLine = addLine("agent", "");
  },
  "response.output_audio_transcript.delta"(e) {
    if (hooks.mode !== "chat" || !replyLine) return;
    hooks.chat.current += e.delta ?? "";
    replyLine.textContent += e.delta ?? "";
  },
  "response.done"(e, call) {
    if (hooks.mode !== "chat") return;
    const reply = { id: e.response?.id, status: e.response?.status, text: hooks.chat.current };
    pushBounded(hooks.chat.replies, reply, 100);
    replyLine = null;
    $("chat-send").disabled = false;
    call.ui.notice("");
  },
  error() {
    if (hooks.mode === "chat") $("chat-send").disabled = false; // e.g. invalid_image: the message was refused
  },
};

/** Follow one server event (after call.js and modes.js have handled it). */
export function handleChatEvent(event, call) {
  HANDLERS[event.type]?.(event, call);
}
