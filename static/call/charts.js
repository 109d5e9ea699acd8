// Small canvas drawings for the call page: a waveform, time series and a listen/speak strip.
// Plain 2D canvas, no library: each function clears and redraws the whole canvas.

const GRID = "#d9dee7";
const TEXT = "#5b6475";

/** Match the canvas backing store to its CSS size so lines stay crisp on HiDPI screens. */
function prepare(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
  }
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  return { g, width, height };
}

/** Draw time-domain samples in [-1, 1] centred on the canvas. */
export function drawWaveform(canvas, samples, color = "#2f6fde") {
  const { g, width, height } = prepare(canvas);
  g.strokeStyle = GRID;
  g.beginPath();
  g.moveTo(0, height / 2);
  g.lineTo(width, height / 2);
  g.stroke();
  g.strokeStyle = color;
  g.lineWidth = 1.5;
  g.beginPath();
  const step = samples.length / width;
  for (let x = 0; x < width; x++) {
    const v = samples[Math.floor(x * step)] || 0;
    const y = height / 2 - v * (height / 2) * 0.95;
    if (x === 0) g.moveTo(x, y);
    else g.lineTo(x, y);
  }
  g.stroke();
}

/**
 * Draw several series sharing one y axis (ms), newest on the right.
 * @param {HTMLCanvasElement} canvas
 * @param {{label: string, color: string, values: number[]}[]} series
 * @param {number} capacity number of points the x axis spans
 */
export function drawSeries(canvas, series, capacity) {
  const { g, width, height } = prepare(canvas);
  const pad = { left: 38, right: 6, top: 16, bottom: 6 };
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const peak = Math.max(50, ...series.flatMap((s) => s.values.filter(Number.isFinite)));
  const top = niceCeil(peak);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = TEXT;
  g.strokeStyle = GRID;
  g.lineWidth = 1;
  for (const frac of [0, 0.5, 1]) {
    const y = pad.top + plotH * (1 - frac);
    g.beginPath();
    g.moveTo(pad.left, y);
    g.lineTo(width - pad.right, y);
    g.stroke();
    g.fillText(`${Math.round(top * frac)}`, 4, y + 4);
  }
  let legendX = pad.left;
  for (const s of series) {
    g.fillStyle = s.color;
    g.fillText(s.label, legendX, 11);
    legendX += g.measureText(s.label).width + 14;
    g.strokeStyle = s.color;
    g.lineWidth = 1.75;
    g.beginPath();
    const offset = capacity - s.values.length; // right-align: newest point at the right edge
    s.values.forEach((v, i) => {
      if (!Number.isFinite(v)) return;
      const x = pad.left + ((offset + i) / Math.max(1, capacity - 1)) * plotW;
      const y = pad.top + plotH * (1 - Math.min(v, top) / top);
      if (i === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    });
    g.stroke();
  }
  g.fillStyle = TEXT;
  g.fillText("ms", 4, 11);
}

/** Draw one block per unit: grey for listen, green for speak (unit engines, newest right). */
export function drawUnits(canvas, units, capacity = 30) {
  const { g, width, height } = prepare(canvas);
  const w = width / capacity;
  const shown = units.slice(-capacity);
  shown.forEach((u, i) => {
    const x = (capacity - shown.length + i) * w;
    g.fillStyle = u.kind === "speak" ? "#2e9d5b" : "#b8c0cc";
    g.fillRect(x + 1, 4, w - 2, height - 8);
    if (u.endOfTurn) {
      g.fillStyle = "#1d2433";
      g.fillRect(x + w - 3, 4, 2, height - 8);
    }
  });
}

function niceCeil(v) {
  const magnitude = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * magnitude >= v) return m * magnitude;
  return 10 * magnitude;
}
