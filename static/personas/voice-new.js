// Clone-a-voice page: record the clip and the consent sentence with MediaRecorder (webm/opus), or pick files;
// send both in one multipart POST, then follow the voice's progress page.

const $ = (id) => document.getElementById(id);
const recorded = { clip: null, consent: null };

function pickMimeType() {
  for (const type of ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm"]) {
    if (window.MediaRecorder && MediaRecorder.isTypeSupported(type)) return type;
  }
  return "";
}

/** One recorder per button pair: Record starts, Stop ends and keeps the blob. */
function wireRecorder(kind) {
  const start = $(`record-${kind}`);
  const stop = $(`stop-${kind}`);
  const state = $(`${kind}-state`);
  const playback = $(`${kind}-playback`);
  let recorder = null;
  let stream = null;
  start.addEventListener("click", async () => {
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
    } catch (error) {
      state.textContent = `Microphone unavailable: ${error.message}`;
      return;
    }
    const chunks = [];
    const mimeType = pickMimeType();
    recorder = new MediaRecorder(stream, mimeType ? { mimeType } : {});
    recorder.addEventListener("dataavailable", (event) => event.data.size && chunks.push(event.data));
    recorder.addEventListener("stop", () => {
      stream.getTracks().forEach((track) => track.stop());
      recorded[kind] = new Blob(chunks, { type: recorder.mimeType || "audio/webm" });
      playback.src = URL.createObjectURL(recorded[kind]);
      playback.hidden = false;
      state.textContent = `Recorded ${(recorded[kind].size / 1024).toFixed(0)} KB.`;
      state.dataset.recorded = "1";
    });
    recorder.start(250);
    const began = performance.now();
    state.dataset.recorded = "";
    state.textContent = "Recording…";
    const tick = setInterval(() => {
      if (recorder.state !== "recording") return clearInterval(tick);
      state.textContent = `Recording… ${((performance.now() - began) / 1000).toFixed(0)} s`;
    }, 500);
    start.disabled = true;
    stop.disabled = false;
  });
  stop.addEventListener("click", () => {
    if (recorder && recorder.state === "recording") recorder.stop();
    start.disabled = false;
    stop.disabled = true;
  });
}

function showErrors(messages) {
  const box = $("upload-errors");
  box.replaceChildren(...messages.map((m) => Object.assign(document.createElement("p"), { textContent: m })));
  box.hidden = messages.length === 0;
}

/**
 * The clip's length in seconds, decoded here (null when this browser cannot decode it: the server decides).
 * The server counts speech after trimming silence; a clip shorter than the minimum in all is refused here
 * already, before an upload that could only fail.
 */
async function clipSeconds(blob) {
  const context = new OfflineAudioContext(1, 1, 48000);
  try {
    return (await context.decodeAudioData(await blob.arrayBuffer())).duration;
  } catch {
    return null;
  }
}

wireRecorder("clip");
wireRecorder("consent");

$("voice-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  const data = new FormData(form);
  if (recorded.clip) data.set("clip", recorded.clip, "clip.webm");
  if (recorded.consent) data.set("consent", recorded.consent, "consent.webm");
  const maxBytes = Number(form.dataset.maxBytes);
  for (const field of ["clip", "consent"]) {
    const file = data.get(field);
    if (!(file instanceof Blob) || file.size === 0) return showErrors([`${field}: record or choose a file first.`]);
    if (file.size > maxBytes) return showErrors([`${field}: at most ${maxBytes / 1048576} MB.`]);
  }
  const minSeconds = Number(form.dataset.minSeconds);
  const seconds = await clipSeconds(data.get("clip"));
  if (seconds !== null && seconds < minSeconds) {
    return showErrors([`clip: it is ${seconds.toFixed(1)} s long; a voice needs at least ${minSeconds} s of speech. Record or choose a longer clip.`]);
  }
  showErrors([]);
  $("create-voice").disabled = true;
  try {
    const response = await fetch(form.action || location.href, {
      method: "POST", body: data, headers: { Accept: "application/json" }, credentials: "same-origin",
    });
    const body = await response.json().catch(() => ({ errors: [`The server answered ${response.status}.`] }));
    if (response.ok && body.url) {
      location.assign(body.url);
      return;
    }
    showErrors(body.errors || [`The server answered ${response.status}.`]);
  } catch (error) {
    showErrors([`Upload failed: ${error.message}`]);
  }
  $("create-voice").disabled = false;
});
