// Server events of /v1/realtime -> the call's state, the player, the view and the test hooks.
// One handler per event type; types the page has no use for (response.created, ...) are ignored.

import { closeReasonWords, refusalForError } from "./close-reasons.js";
import { countEvent, hooks, pushBounded } from "./hooks.js";
import { WIRE_RATE } from "./player.js";

const TRANSCRIPT_HOOK_LIMIT = 200_000; // characters kept on window.parley.transcript

/**
 * Apply one parsed server event. Throws on a malformed event; the caller records and drops it.
 * @param {import("./call.js").Call} call
 */
export function handleServerEvent(call, event) {
  const handler = HANDLERS[event.type];
  if (handler) handler(call, event);
}

const HANDLERS = {
  "session.queued"(call, e) {
    hooks.queue = { position: e.position, queue_length: e.queue_length, estimated_wait_s: e.estimated_wait_s };
    call.setState("queued");
    call.ui.setQueue(e);
  },
  "session.created"(call, e) {
    const session = e.session ?? {};
    const duplex = session.duplex ?? {};
    call.markStart("session_created");
    hooks.sessionId = session.id ?? null;
    hooks.resumed = Boolean(e.resumed ?? duplex.resumed);
    hooks.capabilities = duplex.capabilities ?? null;
    call.ui.setSession(hooks.sessionId, hooks.resumed);
    call.ui.setCapabilities(hooks.capabilities);
    hooks.recorded = Boolean(duplex.record);
    call.ui.setRecording(hooks.recorded);
    if (hooks.resumed && duplex.persona) call.ui.showPersona(duplex.persona);
    call.ui.setSessionNames(duplex);
    // Sent before the state turns live, so the server applies it before the first audio frame.
    call.sendSessionUpdate(hooks.resumed);
    call.setState("live");
  },
  "session.prefill"(call, e) {
    pushBounded(hooks.prefillProgress, e.progress, 200);
    const done = e.done || e.progress >= 1;
    if (done) {
      if (call.state === "prefilling") call.setState("live");
      return;
    }
    if (call.state !== "prefilling") call.setState("prefilling");
    call.ui.setPrefill(e.progress ?? 0);
  },
  "response.output_audio_transcript.delta"(call, e) {
    const text = e.delta ?? "";
    if (hooks.transcript.length < TRANSCRIPT_HOOK_LIMIT) hooks.transcript += text;
    call.ui.appendTranscript("agent", text, call.sinceStart());
  },
  "response.output_audio_transcript.done"(call) {
    call.ui.endTranscriptLine("agent");
  },
  // The caller's side (OpenAI's input transcription events): deltas as they come, then the whole utterance.
  "conversation.item.input_audio_transcription.delta"(call, e) {
    call.ui.appendTranscript("caller", e.delta ?? "", call.sinceStart());
  },
  "conversation.item.input_audio_transcription.completed"(call, e) {
    call.ui.appendTranscript("caller", e.transcript ?? "", call.sinceStart(), { replace: true });
    call.ui.endTranscriptLine("caller");
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
  // Whether the server keeps up, in words (the counters alone say it only to someone who reads them).
  "session.status"(call, e) {
    hooks.serverStatus = { level: e.level, code: e.code, message: e.message };
    // Two kinds share the line: the server keeping up (server_*) and the caller's echo (echo_*).
    const kind = String(e.code ?? "").startsWith("echo_") ? "echo" : "server";
    hooks.statusLines[kind] = e.level === "warning" ? e.message : "";
    call.ui.setServerStatus(hooks.statusLines);
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
  "session.updated"(call, e) {
    const duplex = (e.session ?? {}).duplex ?? {};
    hooks.recorded = Boolean(duplex.record);
    call.ui.setRecording(hooks.recorded);
    hooks.sessionNames = { persona: duplex.persona_name ?? null, version: duplex.persona_version ?? null, voice: duplex.voice ?? null };
    call.ui.setSessionNames(duplex);
  },
  "session.closed"(call, e) {
    hooks.closeReason = e.reason ?? null;
    const recorded = hooks.recorded && hooks.sessionId;
    call.ui.setRecording(false);
    if (e.reason === "admin_ended") call.ui.notice("An administrator ended this call.", "info");
    call.teardown("closed", closeReasonWords(e.reason));
    call.ui.showRecordingLink(recorded ? `/recordings/session/${encodeURIComponent(hooks.sessionId)}/` : null);
  },
  error(call, e) {
    const err = e.error ?? {};
    pushBounded(hooks.errors, { code: err.code, type: err.type, message: err.message }, 50);
    // Persona and voice are fixed once audio began: on a takeover the server keeps the running
    // session's persona, which is what the user wants, so this is only worth a quiet note.
    const quiet = ["persona_update_unsupported", "voice_update_unsupported", "session_not_ready"].includes(err.code);
    call.ui.notice(quiet ? `Note: ${err.message}` : `Error (${err.code}): ${err.message}`, quiet ? "info" : "error");
    // The server says what is full (slots, the model's memory, or its compute time): that is the caller's answer.
    if (err.code === "resource_exhausted") call.teardown("failed", `The server cannot take the call now: ${err.message}`);
    const refusal = refusalForError(err.code);
    if (refusal) call.teardown("failed", refusal);
  },
};

/**
 * One chunk of agent audio, from a binary frame or a base64 delta (`viaEvent`), as the socket's Worker
 * reports it: counted and measured here; the Worker has already handed it to the player.
 */
export function noteAgentAudio(call, { samples, sumSquares, viaEvent }) {
  if (viaEvent) countEvent("response.output_audio.delta");
  call.markStart("first_chunk_received");
  hooks.audioChunksReceived++;
  hooks.audioMsReceived += (samples / WIRE_RATE) * 1000;
  call.receivedSumSquares += sumSquares;
  call.receivedSamples += samples;
  hooks.receivedRms = call.receivedSamples ? Math.sqrt(call.receivedSumSquares / call.receivedSamples) : 0;
  if (call.state === "prefilling") call.setState("live"); // audio means the prefill is over
}

function addUnit(call, kind, e) {
  const unit = { kind, unit: e.unit ?? hooks.units.length, endOfTurn: Boolean(e.end_of_turn) };
  pushBounded(hooks.units, unit, 200);
  call.ui.addUnit(unit);
}

