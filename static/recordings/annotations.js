// The review panel's timeline selection: the labelled spans drawn on a track under the waveforms, a drag
// across it (or the "at playhead" buttons, or typing) fills the span form. Everything else is plain forms.
// Reads the player's clock from window.review (review.js); draws nothing until the recording has loaded.

const panel = document.getElementById("review-panel");
const track = document.getElementById("span-track");
const start = document.getElementById("span-start");
const end = document.getElementById("span-end");
const COLORS = { good: "#2e7d32", echo: "#8e24aa", "too slow": "#b07800", "missed a turn": "#1d5fa8" };

const hooks = { selection: null, spans: 0 };
window.reviewSpans = hooks;

function duration() {
  return (window.review && window.review.duration) || Number(panel.dataset.duration) || 0;
}

function spans() {
  return [...document.querySelectorAll("#annotations li[data-annotation]")].map((item) => ({
    start: Number(item.dataset.start),
    end: Number(item.dataset.end),
    label: item.dataset.label,
  }));
}

function selection() {
  const a = Number(start.value);
  const b = Number(end.value);
  return start.value !== "" && end.value !== "" && b > a ? [a, b] : null;
}

function draw() {
  if (!track) return;
  const ratio = window.devicePixelRatio || 1;
  track.width = Math.round(track.clientWidth * ratio);
  track.height = Math.round(track.clientHeight * ratio);
  const g = track.getContext("2d");
  const total = duration();
  if (!total) return;
  const x = (t) => (t / total) * track.width;
  const all = spans();
  all.forEach((span, i) => {
    g.fillStyle = COLORS[span.label] ?? "#d12a2a";
    const y = (i % 2) * (track.height / 2);
    g.fillRect(x(span.start), y + 2, Math.max(2, x(span.end) - x(span.start)), track.height / 2 - 4);
  });
  hooks.spans = all.length;
  const chosen = selection();
  hooks.selection = chosen;
  if (chosen) {
    g.strokeStyle = "#ff6d00";
    g.lineWidth = 2 * ratio;
    g.strokeRect(x(chosen[0]), 1, Math.max(2, x(chosen[1]) - x(chosen[0])), track.height - 2);
  }
  if (window.review && window.review.state !== "loading") {
    g.fillStyle = "#ff6d00";
    g.fillRect(x(window.review.position) - 1, 0, 2, track.height);
  }
}

function at(event) {
  const rect = track.getBoundingClientRect();
  const fraction = Math.min(1, Math.max(0, (event.clientX - rect.left) / rect.width));
  return Math.round(fraction * duration() * 10) / 10;
}

function setSpan(a, b) {
  start.value = Math.min(a, b).toFixed(1);
  end.value = Math.max(a, b).toFixed(1);
  draw();
}

if (track) {
  let anchor = null;
  track.addEventListener("pointerdown", (event) => {
    anchor = at(event);
    track.setPointerCapture(event.pointerId);
    setSpan(anchor, anchor);
  });
  track.addEventListener("pointermove", (event) => {
    if (anchor !== null) setSpan(anchor, at(event));
  });
  track.addEventListener("pointerup", (event) => {
    if (anchor === null) return;
    setSpan(anchor, at(event));
    anchor = null;
    document.getElementById("span-label").focus(); // next step: pick the label
  });
  for (const [id, input] of [["start-at-playhead", start], ["end-at-playhead", end]]) {
    const button = document.getElementById(id);
    button.hidden = false;
    button.addEventListener("click", () => {
      input.value = (window.review?.position ?? 0).toFixed(1);
      draw();
    });
  }
  start.addEventListener("input", draw);
  end.addEventListener("input", draw);
  window.addEventListener("resize", draw);
  const frame = () => {
    draw();
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}
