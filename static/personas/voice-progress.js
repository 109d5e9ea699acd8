// A voice's page: follow its processing (stage + percent) until it is ready, failed or disabled.

const $ = (id) => document.getElementById(id);
const section = $("voice-progress");
const FINAL = new Set(["ready", "failed", "disabled"]);
// Time left, extrapolated from the progress so far: said once there is enough of it to go on.
const ESTIMATE_AFTER_PERCENT = 5;
const ESTIMATE_AFTER_MS = 1000;
let firstSeen = null; // {at, percent} of the first status this page saw while the voice was being prepared

function estimate(voice) {
  if (FINAL.has(voice.status)) return "";
  const now = performance.now();
  if (firstSeen === null) firstSeen = { at: now, percent: voice.percent };
  const done = voice.percent - firstSeen.percent;
  const elapsed = now - firstSeen.at;
  if (voice.percent < ESTIMATE_AFTER_PERCENT || done <= 0 || elapsed < ESTIMATE_AFTER_MS) return "estimating the time left…";
  const left = ((100 - voice.percent) * elapsed) / done / 1000;
  return left < 1 ? "almost done" : `about ${Math.ceil(left)} s left`;
}

function render(voice) {
  const status = $("voice-status");
  status.textContent = voice.status;
  status.className = `status status-${voice.status}`;
  const working = !FINAL.has(voice.status);
  // Stage and bar only while the voice is prepared: a failed one must not keep a bar stuck part-way.
  $("voice-stage").textContent = voice.stage;
  $("voice-stage").hidden = !working;
  $("voice-progress-row").hidden = !working;
  $("voice-percent").value = voice.percent;
  const left = estimate(voice);
  $("voice-percent-label").textContent = left ? `${voice.percent} % · ${left}` : `${voice.percent} %`;
  $("voice-reason").textContent = voice.reason;
  $("voice-reason").hidden = !voice.reason;
  $("voice-failed-actions").hidden = voice.status !== "failed" || !$("delete-voice");
  $("voice-use").hidden = voice.status !== "ready";
  if (voice.status === "ready" && !$("voice-preview").getAttribute("src")) {
    $("voice-preview").src = section.dataset.previewUrl;
  }
  $("voice-preview-row").hidden = voice.status !== "ready";
}

async function follow() {
  while (true) {
    try {
      const response = await fetch(section.dataset.statusUrl, { credentials: "same-origin" });
      if (response.ok) {
        const voice = await response.json();
        render(voice);
        if (FINAL.has(voice.status)) return;
      }
    } catch {
      // a dropped request: try again on the next round
    }
    await new Promise((resolve) => setTimeout(resolve, 400));
  }
}

if (!FINAL.has($("voice-status").textContent.trim())) follow();
