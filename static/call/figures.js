// The call's figures: the numbers beside the call (engine ticks, lag, frames, jitter buffer, mouth-to-ear) and
// the test hooks they are read from, refreshed twice a second while a call runs and once more at its end.

import { hooks } from "./hooks.js";

/** Read the player, the audio clock, the transport's own stats and the last session.metrics into hooks and figures. */
export function refreshFigures(call) {
  // Over WebRTC the browser's own stack has the downlink's figures (read now, shown at the next refresh).
  call.transport?.stats?.().then((figures) => {
    call.player?.update?.(figures);
    if (figures?.packetsReceived !== undefined) {
      hooks.audioChunksReceived = figures.packetsReceived;
      hooks.receivedRms = figures.rms;
      hooks.rtc = figures;
    }
  });
  const player = call.player;
  if (player) {
    hooks.playedRms = player.playedRms;
    hooks.playedMs = player.stats.playedMs;
    hooks.bufferMs = player.depthMs;
    hooks.underruns = player.stats.underruns;
    hooks.overruns = player.stats.overruns;
    hooks.jitter = {
      targetMs: player.targetMs,
      grows: player.stats.grows,
      shrinks: player.stats.shrinks,
      slipDroppedMs: player.stats.slipDroppedMs, // dropped because the audio clock fell behind the wall
    };
  }
  if (call.ctx) {
    // The audio clock against the page's: a starved audio thread makes contextMs fall behind performanceMs.
    hooks.audioClock = { contextMs: call.ctx.currentTime * 1000, performanceMs: performance.now() };
  }
  const m = hooks.metrics ?? {};
  const mouthToEar = call.meter?.measure(m) ?? null;
  hooks.mouthToEarMs = mouthToEar;
  hooks.latencyParts = call.meter?.parts ?? null;
  call.ui.setFigures({
    tick_p50: fmt(m.tick_ms_p50),
    tick_p99: fmt(m.tick_ms_p99),
    lag: fmt(m.lag_ms),
    frames_in: m.frames_in,
    frames_out: m.frames_out,
    dropped: m.dropped_frames,
    buffer: fmt(hooks.bufferMs),
    underruns: hooks.underruns,
    overruns: hooks.overruns,
    mouth_to_ear: fmt(mouthToEar),
    frames_sent: hooks.framesSent,
    chunks_received: hooks.audioChunksReceived,
  });
  if (call.ctx) call.ui.pushLatency({ mouthToEar, depth: hooks.bufferMs, tickP99: m.tick_ms_p99 });
}

/** The start's steps, in the order they happened: "microphone 29 ms · connected 81 ms · ...". */
export function describeStart(timeline) {
  const names = {
    microphone: "microphone",
    socket_open: "socket open",
    session_created: "session created",
    first_chunk_received: "first agent audio received",
    first_sound: "heard",
  };
  return Object.entries(names)
    .filter(([step]) => Number.isFinite(timeline[step]))
    .map(([step, name]) => `${name} ${timeline[step]} ms`)
    .join(" · ");
}

/** A duration for the figures: tenths below 10 ms, whole ms above; null when unknown. */
export function fmt(ms) {
  if (!Number.isFinite(ms)) return null;
  return ms < 10 ? `${ms.toFixed(1)} ms` : `${Math.round(ms)} ms`; // sub-ms ticks of small engines still show
}
