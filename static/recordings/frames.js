// A video call's review: the camera frame the model saw at the playhead. Frame i is shown from its time
// (frames.json) until the next frame's; review.js owns the playhead (window.review.position).
// window.reviewFrames holds test hooks: the frame shown, its time, and the playhead it was chosen for.

const root = document.getElementById("review");
const image = document.getElementById("frame");
const label = document.getElementById("frame-time");
const hooks = { count: 0, index: -1, t: null, position: null, loaded: 0, errors: [] };
window.reviewFrames = hooks;

function frameAt(times, position) {
  let lo = 0;
  let hi = times.length - 1;
  if (!times.length || position < times[0]) return -1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (times[mid] <= position) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

async function start() {
  const response = await fetch(root.dataset.framesindexUrl);
  if (!response.ok) throw new Error(`frames.json: HTTP ${response.status}`);
  const times = (await response.json()).frames.map((f) => f.t);
  hooks.count = times.length;
  hooks.times = times;
  image.addEventListener("load", () => hooks.loaded++);
  const show = () => {
    const position = window.review ? window.review.position : 0;
    const index = Math.max(0, frameAt(times, position)); // before the first frame: the first one
    if (index !== hooks.index && times.length) {
      hooks.index = index;
      hooks.t = times[index];
      image.src = `${root.dataset.framesBase}${index}`;
      label.textContent = `frame ${index + 1} of ${times.length}, seen at ${times[index].toFixed(2)} s`;
    }
    hooks.position = position;
    requestAnimationFrame(show);
  };
  requestAnimationFrame(show);
}

start().catch((err) => hooks.errors.push(String(err)));
