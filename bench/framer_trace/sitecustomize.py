"""Traces where a live call's input frames wait, in a web process run by ``bench/serving_e2e.py`` (diagnostic only).

Put this folder first on ``PYTHONPATH`` and name a folder in ``PARLEY_FRAMER_TRACE_DIR``; every process that imports
the serving code then appends, per process id (perf_counter seconds, the clock the load generator stamps with):

- ``ticks-<pid>.txt``: each engine step's start (the worker takes its slots' frames right after it);
- ``lane-<pid>.txt``: each binary frame as it reaches the inbound lane, with the frame index its mark carries;
- ``takes-<pid>.txt``: each framer take: the framer, the audio it left standing (ms), its margin (ms) and what it
  found (1 short, 0 a whole frame, -1 nothing);
- ``out-<pid>.txt``: each tick's outputs on their way out: when the worker handed them to the event loop (kind 0,
  with the number of outputs), and when the loop began and ended delivering them (kinds 1 and 2).

``bench/framer_trace.py`` reads them beside the calls' own frame times (``serving_e2e.py --calls-out``). The
wrappers cost a few microseconds a frame; compare traced runs only with traced runs.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

TRACE_DIR = os.environ.get("PARLEY_FRAMER_TRACE_DIR")
FLUSH_ROWS, FLUSH_S = 2000, 2.0


class _Log:
    def __init__(self, name: str):
        self.name, self.rows, self.flushed_at = name, [], time.monotonic()

    def add(self, row: str) -> None:
        self.rows.append(row)
        if len(self.rows) >= FLUSH_ROWS or time.monotonic() - self.flushed_at > FLUSH_S:
            self.flushed_at = time.monotonic()
            with open(os.path.join(TRACE_DIR, f"{self.name}-{os.getpid()}.txt"), "a") as f:
                f.write("\n".join(self.rows) + "\n")
            self.rows.clear()


def _trace_worker(module) -> None:
    log, step = _Log("ticks"), module.EngineWorker._step

    def traced(self, started):
        log.add(f"{time.perf_counter():.6f}")
        return step(self, started)

    module.EngineWorker._step = traced


def _trace_framer(module) -> None:
    log, take = _Log("takes"), module.TickAlignedFramer.take

    def traced(self):
        out = take(self)
        found = -1 if out is None else int(out.short)
        log.add(
            f"{time.perf_counter():.6f} {id(self)} {self._size / self._per_ms:.1f} {self.margin / self._per_ms:.1f} {found}"
        )
        return out

    module.TickAlignedFramer.take = traced


def _trace_lane(module) -> None:
    log, on_message = _Log("lane"), module.InboundLane._on_message

    def traced(self, payload, is_binary):
        if is_binary and len(payload) > 3:  # the mark's first sample: 8 * (index % 4000 + 1), bench/serving_callers.py
            log.add(f"{time.perf_counter():.6f} {int.from_bytes(payload[1:3], 'little', signed=True) // 8 - 1}")
        return on_message(self, payload, is_binary)

    module.InboundLane._on_message = traced


def _trace_delivery(module) -> None:
    log, hand_off, deliver = _Log("out"), module.hand_off, module._deliver

    def traced_hand_off(open_slots, ready, inputs, step_ms):
        log.add(f"{time.perf_counter():.6f} 0 {len(ready)}")
        return hand_off(open_slots, ready, inputs, step_ms)

    def traced_deliver(calls):
        log.add(f"{time.perf_counter():.6f} 1 {len(calls)}")
        deliver(calls)
        log.add(f"{time.perf_counter():.6f} 2 {len(calls)}")

    module.hand_off, module._deliver = traced_hand_off, traced_deliver


PATCHES = {
    "inference.slots.delivery": _trace_delivery,
    "inference.slots.worker": _trace_worker,
    "inference.audio.framing": _trace_framer,
    "webapp.conversations.inbound_lane": _trace_lane,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Wraps each module of ``PATCHES`` once it has been imported (the web modules need Django's apps first)."""

    def find_spec(self, name, path, target=None):
        patch = PATCHES.get(name)
        if patch is None:
            return None
        PATCHES.pop(name)
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if TRACE_DIR:
    sys.meta_path.insert(0, _PatchAfterImport())
