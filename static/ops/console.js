// Operations console: one snapshot document, pushed over /ops/live about twice a second, drawn here.
// Rows are keyed (a session's <tr> is updated in place, never rebuilt), so filters, focus and a
// pending confirmation survive updates, and 500 sessions cost a few hundred text writes per update.

const root = document.getElementById("console");
const $ = (id) => document.getElementById(id);
const STALE_MS = 3000; // no snapshot for this long: say so instead of showing old numbers as live

let snapshot = JSON.parse($("console-snapshot").textContent);
let lastUpdate = Date.now();

// ---- actions: confirmed in a dialog, POSTed with the CSRF token, answered with an audit entry -----

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

async function act(url, question, target, fields = {}) {
  if (!window.confirm(question)) return;
  const body = new FormData();
  body.set("confirm", target);
  for (const [name, value] of Object.entries(fields)) body.set(name, value);
  let text;
  try {
    const response = await fetch(url, {
      method: "POST", body, credentials: "same-origin", headers: { "X-CSRFToken": csrfToken() },
    });
    const reply = await response.json();
    if (reply.error) text = `Refused: ${reply.error.message}`;
    else {
      text = `${target}: ${reply.outcome}`;
      const item = document.createElement("li");
      item.textContent = `${reply.audit.at.replace("T", " ").slice(0, 19)} · ${reply.audit.actor} · ${question.replace(/\?$/, "")} · ${reply.outcome}`;
      $("audit").prepend(item);
    }
  } catch (error) {
    text = `The action did not reach the server: ${error}`;
  }
  $("action-result").textContent = text;
}

$("admission-toggle").addEventListener("click", () => {
  const open = snapshot.admission_open;
  const question = open ? "Stop admitting new calls?" : "Resume admitting new calls?";
  act(root.dataset.admissionUrl, question, "admission", { open: open ? "0" : "1" });
});

// ---- services --------------------------------------------------------------------------------

const serviceCards = new Map();

function field(dl, label) {
  const dt = document.createElement("dt");
  dt.textContent = label;
  const dd = document.createElement("dd");
  dl.append(dt, dd);
  return dd;
}

function makeServiceCard(id) {
  const card = document.createElement("article");
  card.className = "service";
  card.dataset.serviceId = id;
  const header = document.createElement("header");
  const title = document.createElement("h3");
  title.textContent = id;
  const badge = document.createElement("span");
  badge.className = "badge";
  const drain = document.createElement("button");
  drain.type = "button";
  drain.className = "action drain";
  header.append(title, badge, drain);
  const held = document.createElement("div");
  held.className = "held";
  const heldText = document.createElement("span");
  heldText.className = "held-text";
  const heldMeter = document.createElement("meter");
  heldMeter.className = "held-meter";
  heldMeter.min = 0;
  held.append(heldText, heldMeter);
  const dl = document.createElement("dl");
  const cells = {};
  for (const [key, label] of [["host", "host"], ["device", "device"], ["engine", "engine"], ["checkpoint", "checkpoint"],
    ["slots", "slots"], ["queue", "queue"], ["tick", "tick p50 / p99"], ["memory", "memory"], ["beat", "heartbeat"]]) {
    cells[key] = field(dl, label);
  }
  const tickLabel = document.createElement("div");
  tickLabel.className = "spark-label";
  tickLabel.textContent = "tick ms (p50, p99), last minutes";
  const tickCanvas = document.createElement("canvas");
  tickCanvas.className = "spark tick-spark";
  const slotLabel = document.createElement("div");
  slotLabel.className = "spark-label";
  slotLabel.textContent = "calls held over time (dashed: capacity)";
  const slotCanvas = document.createElement("canvas");
  slotCanvas.className = "spark slot-spark";
  card.append(header, held, dl, tickLabel, tickCanvas, slotLabel, slotCanvas);
  drain.addEventListener("click", () => {
    const draining = card.dataset.state === "draining";
    const question = draining ? `Resume placing new sessions on ${id}?` : `Drain ${id} (no new sessions; current ones finish)?`;
    act(root.dataset.drainUrl.replace("SERVICE", encodeURIComponent(id)), question, id, { draining: draining ? "0" : "1" });
  });
  return { card, badge, drain, cells, tickCanvas, slotCanvas, heldText, heldMeter };
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

// A line chart on a canvas: each series is [values, colour]; the y axis starts at 0 so heights compare.
function sparkline(canvas, series, yMax, budget) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 300, height = canvas.clientHeight || 48;
  if (canvas.width !== Math.round(width * ratio)) { canvas.width = Math.round(width * ratio); canvas.height = Math.round(height * ratio); }
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  const top = Math.max(yMax, 1e-9);
  const y = (v) => height - 2 - (height - 4) * Math.min(v, top) / top;
  if (budget) {
    g.strokeStyle = "#d9534f"; g.setLineDash([3, 3]); g.beginPath();
    g.moveTo(0, y(budget)); g.lineTo(width, y(budget)); g.stroke(); g.setLineDash([]);
  }
  for (const [values, colour] of series) {
    if (values.length < 2) continue;
    g.strokeStyle = colour; g.lineWidth = 1.5; g.beginPath();
    values.forEach((v, i) => {
      const x = (i / (values.length - 1)) * width;
      if (i) g.lineTo(x, y(v)); else g.moveTo(x, y(v));
    });
    g.stroke();
  }
  g.fillStyle = "#666"; g.font = "10px system-ui";
  g.fillText(`${Math.round(top * 10) / 10}`, 2, 10);
}

// Calls held against what the engine reports it admits: at its call mix (paged KV), else its slots.
function capacityOf(s) {
  const c = s.capacity || {};
  return Number.isFinite(c.call_mix) ? c.call_mix : s.slots_total;
}

function renderHeld(view, s) {
  const c = s.capacity || {}, cap = capacityOf(s);
  const detail = [];
  if (c.mean_call_s) detail.push(`at the ${Math.round(c.mean_call_s / 6) / 10}-min call mix`);
  if (Number.isFinite(c.full_context) && c.full_context !== cap) detail.push(`${c.full_context} at full context`);
  if (Number.isFinite(c.admits_now)) detail.push(`admits ${c.admits_now} more now`);
  view.heldText.textContent = `calls held ${s.slots_used} / ${cap}` + (detail.length ? ` (${detail.join(", ")})` : "");
  view.heldMeter.max = Math.max(cap, 1);
  view.heldMeter.value = Math.min(s.slots_used, Math.max(cap, 1));
  view.heldMeter.high = 0.9 * Math.max(cap, 1);
  view.heldMeter.optimum = 0;
  view.heldMeter.title = `${s.slots_used} of ${cap} sessions the engine admits`;
  view.heldMeter.setAttribute("aria-label", `calls held on ${s.service_id}`);
}

function hostTotals(services) {
  const hosts = new Map();
  for (const s of services) {
    if (s.state === "down") continue;
    const h = hosts.get(s.host) || { held: 0, capacity: 0 };
    h.held += s.slots_used;
    h.capacity += capacityOf(s);
    hosts.set(s.host, h);
  }
  return [...hosts].map(([host, h]) => `${host} ${h.held} / ${h.capacity}`).join(" · ");
}

// Checkpoints being fetched from the hub (a PARLEY_CHECKPOINT hub id), with their progress.
function renderDownloads(downloads) {
  const list = $("downloads");
  list.hidden = !downloads.length;
  list.replaceChildren(...downloads.map((d) => {
    const li = document.createElement("li");
    li.dataset.repo = d.repo;
    li.dataset.state = d.state;
    const files = d.files_total ? ` · ${d.files_done} / ${d.files_total} files` : "";
    const size = d.bytes_total ? ` · ${bytes(d.bytes_done)} / ${bytes(d.bytes_total)}` : "";
    li.textContent = `${d.repo}: ${d.state}${size}${files}`;
    if (d.bytes_total) {
      const bar = document.createElement("progress");
      bar.max = d.bytes_total;
      bar.value = Math.min(d.bytes_done, d.bytes_total);
      bar.setAttribute("aria-label", `download of ${d.repo}`);
      li.append(bar);
    }
    return li;
  }));
}

function renderServices(services) {
  const seen = new Set();
  for (const s of services) {
    seen.add(s.service_id);
    let view = serviceCards.get(s.service_id);
    if (!view) {
      view = makeServiceCard(s.service_id);
      serviceCards.set(s.service_id, view);
      $("services").append(view.card);
    }
    view.card.dataset.state = s.state;
    view.badge.dataset.state = s.state;
    view.badge.textContent = s.state + (s.down_reason ? ` (${s.down_reason})` : "");
    view.drain.textContent = s.state === "draining" ? "Undrain" : "Drain";
    view.drain.disabled = s.state === "down";
    const c = view.cells;
    c.host.textContent = `${s.host} · ${s.address}`;
    c.device.textContent = s.device;
    c.engine.textContent = s.engine;
    c.checkpoint.textContent = s.checkpoint || "—";
    c.slots.textContent = `${s.slots_used} / ${s.slots_total}`;
    renderHeld(view, s);
    c.queue.textContent = String(s.queue_length);
    c.tick.textContent = `${s.tick_ms_p50.toFixed(1)} / ${s.tick_ms_p99.toFixed(1)} ms`;
    const memory = Object.entries(s.gpu_memory || {});
    // Only a service on a GPU has GPU memory to show; a CPU service's row says what it runs on instead.
    const onGpu = /^(cuda|gpu)/i.test(s.device || "") || memory.length > 0;
    c.memory.previousElementSibling.textContent = onGpu ? "GPU memory" : "memory";
    c.memory.textContent = memory.length ? memory.map(([k, v]) => `${k} ${bytes(v)}`).join(", ") : onGpu ? "—" : "system (CPU service)";
    c.beat.textContent = `${Math.max(0, snapshot.at - s.heartbeat_at).toFixed(1)} s ago`;
    const p50 = s.history.map((p) => p[1]), p99 = s.history.map((p) => p[2]), used = s.history.map((p) => p[3]);
    sparkline(view.tickCanvas, [[p50, "#4a7bd0"], [p99, "#1d2b3a"]], Math.max(1, ...p99), 80);
    sparkline(view.slotCanvas, [[used, "#2f8f4e"]], Math.max(1, s.slots_total), capacityOf(s));
  }
  for (const [id, view] of serviceCards) {
    if (!seen.has(id)) { view.card.remove(); serviceCards.delete(id); }
  }
  const totals = snapshot.totals;
  $("service-totals").textContent = `${services.length} · calls held ${totals.slots_used} / ${totals.capacity ?? totals.slots_total} · queue ${totals.queue_length}`;
  $("host-totals").textContent = services.length ? `per host: ${hostTotals(services)}` : "";
}

// ---- sessions ----------------------------------------------------------------------------------

const COLUMNS = ["username", "persona", "voice_name", "engine", "mode", "service_id", "duration", "state",
  "frames_in", "frames_out", "dropped_frames", "lag_ms", "record", "session_id"];
const NUMERIC = new Set(["frames_in", "frames_out", "dropped_frames", "lag_ms"]);
const rows = new Map(); // session_id -> {tr, cells, row}

function duration(seconds) {
  const s = Math.floor(seconds);
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

function cellText(row, key) {
  if (key === "duration") return duration(row.duration_s);
  if (key === "record") return row.record ? "on" : "off";
  if (key === "persona") return row.persona || "—";
  if (key === "voice_name") return row.voice_name || "—";
  return String(row[key] ?? "");
}

function makeRow(row) {
  const tr = document.createElement("tr");
  tr.dataset.sessionId = row.session_id;
  const cells = {};
  for (const key of COLUMNS) {
    const td = document.createElement("td");
    td.dataset.col = key;
    if (NUMERIC.has(key)) td.className = "num";
    if (key === "session_id") td.className = "mono";
    cells[key] = td;
    tr.append(td);
  }
  const actions = document.createElement("td");
  actions.className = "row-actions";
  const end = document.createElement("button");
  end.type = "button"; end.className = "action end-session"; end.textContent = "End";
  end.addEventListener("click", () => {
    const current = rows.get(row.session_id).row;
    act(root.dataset.endUrl.replace("SESSION", encodeURIComponent(current.session_id)),
      `End the session of ${current.username} (${current.session_id})?`, current.session_id);
  });
  const voice = document.createElement("button");
  voice.type = "button"; voice.className = "action disable-voice"; voice.textContent = "Disable voice";
  voice.addEventListener("click", () => {
    const current = rows.get(row.session_id).row;
    act(root.dataset.voiceUrl.replace(/0\/disable\/$/, `${encodeURIComponent(current.voice)}/disable/`),
      `Disable the voice ${current.voice_name} for new calls?`, current.voice);
  });
  actions.append(end, " ", voice);
  tr.append(actions);
  return { tr, cells, voiceButton: voice };
}

function matches(row, filters) {
  if (filters.state && row.state !== filters.state) return false;
  if (filters.service && row.service_id !== filters.service) return false;
  if (filters.engine && row.engine !== filters.engine) return false;
  if (!filters.text) return true;
  const haystack = `${row.username} ${row.session_id} ${row.persona || ""} ${row.voice_name || ""} ${row.user_key}`;
  return haystack.toLowerCase().includes(filters.text);
}

function currentFilters() {
  return {
    text: $("filter-text").value.trim().toLowerCase(),
    state: $("filter-state").value,
    service: $("filter-service").value,
    engine: $("filter-engine").value,
  };
}

function syncOptions(select, values) {
  const have = new Set([...select.options].map((o) => o.value));
  for (const value of [...values].sort()) {
    if (!have.has(value)) select.add(new Option(value, value));
  }
}

function renderSessions(sessions) {
  const body = document.querySelector("#sessions tbody");
  const filters = currentFilters();
  const seen = new Set();
  let shown = 0;
  for (const row of sessions) {
    seen.add(row.session_id);
    let view = rows.get(row.session_id);
    if (!view) {
      view = makeRow(row);
      rows.set(row.session_id, view);
      body.append(view.tr);
    }
    view.row = row;
    view.tr.dataset.state = row.state;
    for (const key of COLUMNS) {
      const text = cellText(row, key);
      if (view.cells[key].textContent !== text) {
        view.cells[key].textContent = text;
        view.cells[key].title = text; // a cell cut to one line shows the whole text on hover
      }
    }
    view.voiceButton.hidden = !row.voice || !/^\d+$/.test(row.voice);
    const visible = matches(row, filters);
    view.tr.hidden = !visible;
    if (visible) shown++;
  }
  for (const [id, view] of rows) {
    if (!seen.has(id)) { view.tr.remove(); rows.delete(id); }
  }
  syncOptions($("filter-service"), new Set(snapshot.services.map((s) => s.service_id)));
  syncOptions($("filter-engine"), new Set(snapshot.services.map((s) => s.engine)));
  $("session-count").textContent = `${shown} shown of ${sessions.length}`;
}

function renderQueue(queue) {
  const body = document.querySelector("#queue tbody");
  body.replaceChildren(...queue.map((row) => {
    const tr = document.createElement("tr");
    for (const text of [row.queue_position, row.username, row.service_id, duration(row.duration_s),
      row.estimated_wait_s == null ? "—" : `${Math.round(row.estimated_wait_s)} s`]) {
      const td = document.createElement("td");
      td.textContent = String(text);
      tr.append(td);
    }
    return tr;
  }));
  $("queue-count").textContent = String(queue.length);
}

// ---- the whole page ----------------------------------------------------------------------------

function render() {
  $("unavailable").hidden = !snapshot.unavailable;
  $("unavailable").textContent = snapshot.unavailable ? `Services unavailable: ${snapshot.unavailable}` : "";
  const admission = $("admission-state");
  admission.dataset.open = String(snapshot.admission_open);
  admission.textContent = snapshot.admission_open ? "admitting new calls" : "new calls stopped";
  $("admission-toggle").textContent = snapshot.admission_open ? "Stop admitting" : "Resume admitting";
  renderServices(snapshot.services);
  renderDownloads(snapshot.downloads || []);
  renderSessions(snapshot.sessions);
  renderQueue(snapshot.queue);
}

for (const id of ["filter-text", "filter-state", "filter-service", "filter-engine"]) {
  $(id).addEventListener("input", () => renderSessions(snapshot.sessions));
}
$("filters").addEventListener("submit", (event) => event.preventDefault());

function setLive(state, text) {
  const badge = $("live-state");
  badge.dataset.state = state;
  badge.textContent = text;
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}${root.dataset.socket}`);
  socket.addEventListener("open", () => setLive("live", "live"));
  socket.addEventListener("message", (message) => {
    snapshot = JSON.parse(message.data);
    lastUpdate = Date.now();
    render();
  });
  socket.addEventListener("close", () => {
    setLive("closed", "disconnected, retrying…");
    setTimeout(connect, 2000);
  });
}

setInterval(() => {
  const age = Date.now() - lastUpdate;
  if (age > STALE_MS && $("live-state").dataset.state === "live") setLive("stale", `no update for ${Math.round(age / 1000)} s`);
  else if (age <= STALE_MS && $("live-state").dataset.state === "stale") setLive("live", "live");
}, 1000);

render();
connect();
