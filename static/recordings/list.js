// The recordings list: rows still recording or processing show live progress, polled from status.json.
const script = document.getElementById("list-script");
const statusUrl = script.dataset.statusUrl;
const POLL_MS = 700;
const UNFINISHED = new Set(["recording", "processing"]);

function rows() {
  return [...document.querySelectorAll("tr[data-recording]")];
}

function apply(row, info) {
  row.dataset.status = info.status;
  const badge = row.querySelector(".status-badge");
  badge.textContent = info.status;
  badge.dataset.statusLabel = info.status;
  const bar = row.querySelector(".rec-progress");
  bar.hidden = info.status !== "processing";
  bar.value = info.progress;
  bar.title = `${Math.round(info.progress * 100)} %`;
  if (info.echo_flagged && !row.querySelector(".echo-flag")) {
    const flag = document.createElement("span");
    flag.className = "echo-flag";
    flag.textContent = "the agent could hear itself";
    badge.after(flag);
  }
  let reason = row.querySelector(".reason");
  if (info.reason) {
    if (!reason) {
      reason = document.createElement("div");
      reason.className = "reason";
      row.querySelector(".rec-status").append(reason);
    }
    reason.textContent = info.reason;
  } else if (reason) {
    reason.remove();
  }
  if (info.duration_s !== null) {
    row.querySelector(".rec-duration").textContent = `${info.duration_s.toFixed(1)} s`;
  }
}

async function poll() {
  const waiting = rows().filter((row) => UNFINISHED.has(row.dataset.status));
  if (waiting.length === 0) return;
  try {
    const ids = waiting.map((row) => row.dataset.recording).join(",");
    const response = await fetch(`${statusUrl}?ids=${ids}`, { headers: { Accept: "application/json" } });
    if (response.ok) {
      const { recordings } = await response.json();
      for (const info of recordings) {
        const row = document.querySelector(`tr[data-recording="${info.id}"]`);
        if (row) apply(row, info);
      }
    }
  } catch (err) {
    console.warn("status poll failed", err);
  }
  setTimeout(poll, POLL_MS);
}

poll();
