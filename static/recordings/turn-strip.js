// The turn-taking strip under the review's waveforms: who spoke when (caller above, agent below), where
// they overlapped, where the caller interrupted (filled: the agent yielded; hollow: it talked on), and
// each response latency (caller stops -> agent starts) as a bracket with its length. The numbers come
// from the recording's turn-taking measures (webapp/recordings/turn_taking.py), rendered into the page as
// JSON; the table beside it says the same in words.

const COLORS = { caller: "#1d5fa8", agent: "#2e7d32", overlap: "rgba(196, 40, 40, 0.35)", latency: "#8a5a00" };

/** Draw `m` (the turn-taking measures) over `duration` seconds; returns the image (for the playhead) and counts. */
export function drawTurnStrip(canvas, m, duration) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(canvas.clientWidth * ratio);
  canvas.height = Math.round(canvas.clientHeight * ratio);
  const g = canvas.getContext("2d");
  const { width, height } = canvas;
  const x = (t) => (t / duration) * width;
  const lane = { caller: [height * 0.08, height * 0.3], agent: [height * 0.56, height * 0.3] };
  g.clearRect(0, 0, width, height);
  for (const o of m.overlaps ?? []) {
    g.fillStyle = COLORS.overlap;
    g.fillRect(x(o.start), 0, Math.max(2, x(o.length_s)), height);
  }
  for (const [speaker, start, end] of m.segments ?? []) {
    const [top, h] = lane[speaker] ?? lane.caller;
    g.fillStyle = COLORS[speaker] ?? "#666";
    g.fillRect(x(start), top, Math.max(1, x(end - start)), h);
  }
  g.font = `${Math.round(10 * ratio)}px sans-serif`;
  for (const r of m.responses ?? []) {
    const [a, b, y] = [x(r.start), x(r.start + r.length_s), height * 0.47];
    g.strokeStyle = g.fillStyle = COLORS.latency;
    g.lineWidth = ratio;
    g.beginPath();
    g.moveTo(a, y - 4 * ratio);
    g.lineTo(a, y);
    g.lineTo(b, y);
    g.lineTo(b, y - 4 * ratio);
    g.stroke();
    if (b - a > 30 * ratio) g.fillText(`${Math.round(r.length_s * 1000)} ms`, a + 2 * ratio, y - 2 * ratio);
  }
  for (const i of m.interruptions ?? []) {
    const px = x(i.start);
    g.beginPath();
    g.moveTo(px, height * 0.38);
    g.lineTo(px - 5 * ratio, height * 0.38 - 8 * ratio);
    g.lineTo(px + 5 * ratio, height * 0.38 - 8 * ratio);
    g.closePath();
    g.strokeStyle = g.fillStyle = "#b00020";
    if (i.yielded) g.fill();
    else g.stroke();
  }
  canvas.setAttribute("aria-label", describe(m));
  return {
    image: g.getImageData(0, 0, width, height),
    counts: {
      segments: (m.segments ?? []).length,
      overlaps: (m.overlaps ?? []).length,
      interruptions: (m.interruptions ?? []).length,
      responses: (m.responses ?? []).length,
    },
  };
}

function describe(m) {
  const talk = (who) => (m.segments ?? []).filter(([s]) => s === who).length;
  return (
    `Turn-taking strip: caller spoke ${talk("caller")} times, agent ${talk("agent")} times, ` +
    `${(m.overlaps ?? []).length} overlaps, ${(m.interruptions ?? []).length} interruptions, ` +
    `${(m.responses ?? []).length} response latencies marked`
  );
}
