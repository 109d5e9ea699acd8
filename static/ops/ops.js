// Occupancy page: re-fetch the server-rendered workers block every second and swap it in.
// The server renders the same template for the first paint and for every refresh, so there is
// one rendering path; the page works (without refreshing) when JavaScript is off.

const container = document.getElementById("workers");
const REFRESH_MS = 1000;

async function refresh() {
  try {
    const response = await fetch(container.dataset.src, { headers: { Accept: "text/html" }, credentials: "same-origin" });
    // A logged-out or demoted user gets a redirect or 403: stop polling instead of showing a login form inline.
    if (!response.ok || response.redirected) return false;
    const html = await response.text();
    // Do not swap while a form is focused: an admin about to click "End session" keeps their target.
    if (!container.contains(document.activeElement) || document.activeElement === document.body) container.innerHTML = html;
  } catch {
    // The server is restarting: try again on the next tick.
  }
  return true;
}

async function loop() {
  if (await refresh()) setTimeout(loop, REFRESH_MS);
}

setTimeout(loop, REFRESH_MS);
