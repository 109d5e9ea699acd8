// Turn-taking modes on the call page: the mode picker (duplex, half-duplex, chat) and, in half-duplex, the
// speech indicator (chat's box and log are chat.js's). call.js calls applyMode() on its session.update and handleModeEvent() on every
// server event; everything else about modes lives here.
//
// Half-duplex asks for OpenAI's server_vad with its defaults (threshold 0.5, prefix_padding_ms 300,
// silence_duration_ms 500): the server cuts the microphone stream into turns and answers each one.

import { hooks, pushBounded } from "./hooks.js";

const $ = (id) => document.getElementById(id);
// Tests shorten a half-duplex or chat response with ?max_response_s=N (a Parley extension; default 30 s).
const MAX_RESPONSE_S = Number(new URLSearchParams(location.search).get("max_response_s")) || null;
const SPEECH_LABELS = {
  listening: "Listening",
  speaking: "You are speaking",
  thinking: "Turn committed",
  answering: "Agent answering",
};

// What the page saw of turns: counts, and each response's id and final status (bounded).
hooks.mode = "duplex";
hooks.turns = { speechStarted: 0, speechStopped: 0, committed: 0, responses: [], speech: "listening" };

/** The mode chosen in the picker; the picker is locked while a call runs. */
export function chosenMode() {
  return $("mode")?.value || "duplex";
}

/** Offer only the modes the engine serves (capabilities.modes; an older server: duplex only). */
export function showModes(caps) {
  const picker = $("mode");
  if (!picker) return;
  const modes = caps?.modes ?? ["duplex"];
  for (const option of picker.options) option.disabled = !modes.includes(option.value);
  if (picker.selectedOptions[0]?.disabled) picker.value = "duplex";
  $("mode-row").hidden = modes.length < 2;
}

/** Add the chosen mode to a session.update (the first one of a call; a resumed call keeps its mode). */
export function applyMode(session, resumed) {
  const mode = chosenMode();
  if (resumed || mode === "duplex") return session;
  hooks.mode = mode;
  session.duplex = { ...session.duplex, mode };
  if (mode === "half_duplex") session.audio.input.turn_detection = { type: "server_vad" };
  if (MAX_RESPONSE_S) session.duplex.max_response_s = MAX_RESPONSE_S; // half-duplex and chat

  return session;
}

function setSpeech(state) {
  hooks.turns.speech = state;
  const badge = $("speech-indicator");
  if (!badge) return;
  badge.dataset.speech = state;
  badge.textContent = SPEECH_LABELS[state];
}

const HANDLERS = {
  "session.created"(e) {
    const duplex = e.session?.duplex ?? {};
    showModes(duplex.capabilities);
    $("mode").disabled = true;
  },
  "session.updated"(e) {
    const mode = e.session?.duplex?.mode ?? "duplex";
    hooks.mode = mode;
    $("mode-shown").textContent = mode.replace("_", "-");
    $("speech-indicator").hidden = mode !== "half_duplex";
  },
  "session.closed"() {
    $("mode").disabled = false;
    $("speech-indicator").hidden = true;
  },
  "input_audio_buffer.speech_started"(e, call) {
    hooks.turns.speechStarted += 1;
    // Barge-in: the server cancels the response; what the player still holds of it must stop now too.
    if (hooks.turns.speech === "answering") call?.player?.flush();
    setSpeech("speaking");
  },
  "input_audio_buffer.speech_stopped"() {
    hooks.turns.speechStopped += 1;
    setSpeech("thinking");
  },
  "input_audio_buffer.committed"() {
    hooks.turns.committed += 1;
  },
  "response.created"() {
    if (hooks.mode === "half_duplex") setSpeech("answering");
  },
  "response.done"(e) {
    pushBounded(hooks.turns.responses, { id: e.response?.id, status: e.response?.status }, 100);
    if (hooks.mode === "half_duplex" && hooks.turns.speech === "answering") setSpeech("listening");
  },
};

/** Follow one server event (call.js has already handled it; this updates the mode's view). */
export function handleModeEvent(event, call) {
  HANDLERS[event.type]?.(event, call);
}

const preview = $("capabilities-preview");
if (preview) showModes(JSON.parse(preview.textContent));
