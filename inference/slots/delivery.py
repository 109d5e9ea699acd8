"""A tick's outputs on their way out of the worker thread: to the recordings and to the sessions' event loops.

Kept apart from ``inference.slots.worker``, which owns the clock, the commands and the engine step. This owns
what happens to the step's outputs: one PCM16 conversion for the whole tick, each recorded slot's step (the
caller's frame, the agent's audio, the camera frame) to the recorder in one batch, and each slot's output to
its ``SlotListener`` with the input position its tick had heard, in one wake-up per event loop, at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from inference.audio.pcm import encode_pcm16_many
from inference.engines.base import SlotInput, SlotOutput
from inference.recording.recorder import record_steps

if TYPE_CHECKING:
    from inference.slots.worker import WorkerSlot


class SlotListener(Protocol):
    """The asyncio-side owner of a slot; its methods are called on its own event loop."""

    def slot_output(self, output: SlotOutput, pcm16: bytes, heard_position: int | None) -> None: ...
    def slot_failed(self, message: str) -> None: ...


def hand_off(
    open_slots: list[WorkerSlot],
    ready: list[tuple[WorkerSlot, SlotOutput]],
    inputs: dict[int, SlotInput],
    step_ms: float,
) -> None:
    """On the worker thread, right after the step: ``ready`` slots' outputs to their recordings and listeners.

    Args:
        open_slots: the slots stepped this tick (a listener whose loop is gone is dropped from them).
        ready: each slot with an output this tick, in slot order.
        inputs: what each slot was given this tick, by slot index (absent: frozen or prefilling).
        step_ms: how long the step took, for the recording.
    """
    deliveries: dict[asyncio.AbstractEventLoop, list[tuple[Callable[..., None], tuple]]] = {}
    recorded: list[tuple[Any, ...]] = []
    # one conversion for the whole tick (per slot it was the worker's largest cost at 128 sessions)
    audible = [out.audio for _, out in ready if out.audio.size]
    encoded = iter(encode_pcm16_many(audible))
    for s, out in ready:
        pcm16 = next(encoded) if out.audio.size else b""
        if pcm16:
            s.frames_out += 1
        if s.recording is not None and s.index in inputs:
            arrived = s.heard_position is not None  # None: no caller audio came in time for this step
            caller = inputs[s.index].audio if arrived else None
            frame = inputs[s.index].image  # the camera frame the engine saw with this step, if any
            recorded.append(s.recording.step_item(caller, pcm16, out, step_ms, frame))
        if s.listener is not None and s.loop is not None:
            heard = s.heard_position if s.index in inputs else None
            deliveries.setdefault(s.loop, []).append((s.listener.slot_output, (out, pcm16, heard)))
    # One wake-up per event loop per tick, not one per slot.
    for loop, calls in deliveries.items():
        if not post_to(loop, _deliver, calls):
            for s in open_slots:
                if s.loop is loop:
                    s.listener = None  # its loop is gone; nobody will read these slots again
    if recorded:
        record_steps(recorded)


def post_to(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> bool:
    """Call ``fn(*args)`` on ``loop`` from the worker thread; False when the loop is gone."""
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:  # the loop was closed (e.g. a finished test); drop the message
        return False


def _deliver(calls: list[tuple[Callable[..., None], tuple]]) -> None:
    """Runs on a session loop: hand one tick's outputs to their listeners."""
    for fn, args in calls:
        fn(*args)
