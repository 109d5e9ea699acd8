// The list page's exports: poll each unfinished one's status until it is ready (then offer its zip) or failed.
const POLL_MS = 700;

async function watch(item) {
  const badge = item.querySelector(".export-status");
  const bar = item.querySelector(".export-progress");
  for (;;) {
    const response = await fetch(item.dataset.statusUrl);
    if (!response.ok) return;
    const info = await response.json();
    badge.textContent = info.status;
    badge.dataset.statusLabel = info.status;
    item.dataset.status = info.status;
    bar.value = info.progress;
    if (info.status === "ready" || info.status === "failed") {
      bar.hidden = true;
      item.querySelector(".export-download").hidden = info.status !== "ready";
      item.querySelector(".export-reason").textContent = info.reason;
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

for (const item of document.querySelectorAll("#export-list li[data-export]")) {
  if (item.dataset.status === "queued" || item.dataset.status === "running") watch(item);
}
