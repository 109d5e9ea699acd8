// While the server is still loading the engine and preparing the default persona and voice (the warm
// start, webapp/calls/warm_start.py), the page says "Getting the agent ready…" with the stage, and Start
// waits; once the server says ready (or the warm-up failed: the call then reports its own error), the
// page is ready to call as usual.

import { hooks } from "./hooks.js";

const POLL_MS = 500;

export async function waitForAgent(call) {
  const url = document.querySelector(".call-page").dataset.warmStartUrl;
  let status = JSON.parse(document.getElementById("warm-start").textContent) ?? { state: "off" };
  while (status.state === "warming") {
    hooks.warmStart = status.state;
    call.setState("warming", status.stage ?? "");
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    try {
      const response = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
      if (response.ok) status = await response.json();
    } catch {
      // the server is busy or restarting: ask again
    }
  }
  hooks.warmStart = status.state;
  if (call.state === "warming") call.setState("idle");
}
