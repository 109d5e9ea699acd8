// A voice's page: follow its processing (stage + percent) until it is ready, failed or disabled.

const $ = (id) => document.getElementById(id);
const section = $("voice-progress");
const FINAL = new Set(["ready", "failed", "disabled"]);

function render(voice) {
  const status = $("voice-status");
  status.textContent = voice.status;
  status.className = `status status-${voice.status}`;
  $("voice-stage").textContent = voice.stage;
  $("voice-percent").value = voice.percent;
  $("voice-percent-label").textContent = `${voice.percent} %`;
  $("voice-reason").textContent = voice.reason;
  $("voice-reason").hidden = !voice.reason;
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
