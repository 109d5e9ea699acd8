"""The echo engine: a transport test engine that returns the caller's audio. No model.

It exists for tests and for measuring the transport alone (``bench/transport.py``). Each slot's
input frame comes back ``delay_frames`` ticks later (silence until then) with a text delta naming
the frame, e.g. ``"[frame 12] "``. Slots open, close, prefill and freeze exactly like a model
engine's, so every path of the worker and the session is exercised without torch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from inference.engines.base import (
    Engine,
    EngineCapabilities,
    EngineError,
    ProgressFn,
    SlotConfig,
    SlotInput,
    SlotOutput,
)

ECHO_LABEL = "echo engine: returns your audio, no model"


@dataclass
class _EchoSlot:
    """Per-slot state: the delay line and the frame counter."""

    delay_line: deque[np.ndarray]
    prefill_left: int
    prefill_total: int
    frames_seen: int = 0


class EchoEngine(Engine):
    """Echoes each slot's input ``delay_frames`` ticks later, with an optional simulated prefill.

    Args:
        num_slots: sessions served at once.
        delay_frames: ticks between an input frame and its echo (silence is returned meanwhile).
        prefill_ticks: ticks of simulated prefill after ``open_slot`` (0 = ready at once).
        slow_tick_ms: test-only: each tick takes at least this long (an engine that cannot keep up).
        slow_for_s: test-only: ... only during the first N seconds after the latest ``open_slot`` (0 = always).
        slot_cost_ms: test-only: each tick takes this much longer per open slot (a tick that grows with its calls).
        chunk_period_ms: the engine clock.
        rate: input and output sample rate (Hz).
    """

    def __init__(
        self,
        num_slots: int = 4,
        *,
        delay_frames: int = 3,
        prefill_ticks: int = 0,
        chunk_period_ms: int = 80,
        rate: int = 24_000,
        slow_tick_ms: float = 0.0,
        slow_for_s: float = 0.0,
        slot_cost_ms: float = 0.0,
    ):
        if num_slots < 1 or delay_frames < 0 or prefill_ticks < 0:
            raise ValueError("num_slots >= 1, delay_frames >= 0 and prefill_ticks >= 0 are required")
        self.num_slots = num_slots
        self.slow_tick_s, self.slow_for_s = slow_tick_ms / 1000.0, slow_for_s
        self.slot_cost_s = slot_cost_ms / 1000.0
        self._opened_at = time.monotonic()
        self.delay_frames = delay_frames
        self.prefill_ticks = prefill_ticks
        chunk = rate * chunk_period_ms // 1000
        self.capabilities = EngineCapabilities(
            engine="echo",
            family="echo",
            chunk_period_ms=chunk_period_ms,
            input_rate=rate,
            input_chunk_samples=chunk,
            output_rate=rate,
            extra={"label": ECHO_LABEL, "delay_frames": delay_frames},
        )
        self._slots: dict[int, _EchoSlot] = {}
        self._silence = np.zeros(chunk, dtype=np.float32)

    @classmethod
    def from_config(cls, config) -> EchoEngine:  # config: inference.config.InferenceConfig
        """Build from the service configuration."""
        return cls(
            config.slots,
            delay_frames=config.echo_delay_frames,
            prefill_ticks=config.echo_prefill_ticks,
            slow_tick_ms=config.test_echo_slow_tick_ms,
            slow_for_s=config.test_echo_slow_for_s,
            slot_cost_ms=config.test_echo_slot_cost_ms,
        )

    def warmup(self, progress: ProgressFn | None = None) -> None:
        """Nothing to load; reports progress once so callers see the same flow as a model engine."""
        if progress is not None:
            progress(1.0, "echo engine ready (no model)")

    def open_slot(self, slot: int, config: SlotConfig) -> None:
        """Start a fresh delay line for ``slot``; the prefill (if any) runs over the next ticks."""
        self._check_slot(slot)
        if slot in self._slots:
            raise EngineError(f"slot {slot} is already open")
        self._opened_at = time.monotonic()
        self._slots[slot] = _EchoSlot(
            delay_line=deque(self._silence for _ in range(self.delay_frames)),
            prefill_left=self.prefill_ticks,
            prefill_total=self.prefill_ticks,
        )

    def live_at_open(self, slot: int) -> bool:
        """Without a simulated prefill the slot echoes from its first tick."""
        return slot in self._slots and self._slots[slot].prefill_left == 0

    def close_slot(self, slot: int) -> None:
        """Forget everything ``slot`` held."""
        self._check_slot(slot)
        self._slots.pop(slot, None)

    def step(self, inputs: Mapping[int, SlotInput]) -> dict[int, SlotOutput]:
        """Advance prefilling slots, echo the live ones; slots absent from ``inputs`` stay frozen."""
        if self.slow_tick_s and (not self.slow_for_s or time.monotonic() - self._opened_at < self.slow_for_s):
            time.sleep(self.slow_tick_s)  # the test hook: a tick that takes longer than the clock allows
        if self.slot_cost_s and self._slots:
            time.sleep(self.slot_cost_s * len(self._slots))  # the test hook: a tick that grows with its calls
        outputs: dict[int, SlotOutput] = {}
        for slot, state in self._slots.items():
            if state.prefill_left > 0:
                state.prefill_left -= 1
                done = state.prefill_total - state.prefill_left
                outputs[slot] = SlotOutput(
                    audio=np.zeros(0, dtype=np.float32),
                    prefilling=state.prefill_left > 0,
                    progress=done / state.prefill_total,
                )
        for slot, slot_input in inputs.items():
            state = self._slots.get(slot)
            if state is None:
                raise EngineError(f"step() got input for slot {slot}, which is not open")
            if slot in outputs and outputs[slot].prefilling:
                continue  # input during prefill is not part of the conversation yet
            if slot_input.audio.shape != self._silence.shape:
                raise EngineError(f"slot {slot}: expected {self._silence.shape} samples, got {slot_input.audio.shape}")
            state.delay_line.append(slot_input.audio)
            out_audio = state.delay_line.popleft()
            text = f"[frame {state.frames_seen - self.delay_frames}] " if state.frames_seen >= self.delay_frames else ""
            state.frames_seen += 1
            outputs[slot] = SlotOutput(audio=out_audio, text=text)
        return outputs

    def cancel(self, slot: int) -> None:
        """Barge-in: whatever is still in the delay line is not said."""
        state = self._slots.get(slot)
        if state is not None:
            state.delay_line = deque(self._silence for _ in range(self.delay_frames))

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise EngineError(f"slot {slot} out of range 0..{self.num_slots - 1}")
