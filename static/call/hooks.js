// Test hooks: plain numbers and strings on `window.parley`, updated as the call runs, so browser
// tests (and a curious person in the console) can read the call's state without reaching into
// the modules. Nothing reads these back; they are a one-way window.

export const hooks = {
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

/** Append to a hook list, keeping only the newest `limit` entries. */
export function pushBounded(list, value, limit) {
  list.push(value);
  if (list.length > limit) list.shift();
}
