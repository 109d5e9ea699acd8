"""Drive several recorded calls through a runner tick by tick (parity tests and benches).

Every tick prefills each call that still has a unit, then decides all of them in one ``generate_many`` (the
fast runner batches them; the eager one runs them in turn), then finalizes. The records are
``replay.unit_record`` dicts, so runs compare field by field with each other and with the goldens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inference.models.minicpmo.audio_encoder import UNIT_SAMPLES
from inference.models.minicpmo.duplex import DuplexRunner
from inference.models.minicpmo.replay import unit_record


@dataclass
class RecordedCall:
    """One call's inputs: user audio (16 kHz), reference voice, frames for some units, forced listens."""

    audio: np.ndarray
    ref_audio: np.ndarray | None
    system_prompt: str = "Streaming Omni Conversation."
    frames: dict[int, np.ndarray] = field(default_factory=dict)  # unit -> uint8 [H, W, 3]
    force_listen_units: set[int] = field(default_factory=set)

    @property
    def units(self) -> int:
        return self.audio.shape[0] // UNIT_SAMPLES

    @classmethod
    def from_scenario(cls, scenario_dir, options: dict) -> RecordedCall:
        """A golden-pack scenario folder with its ``golden.json`` options."""
        frames = {}
        if options["frame_units"]:
            stack = np.load(scenario_dir / "frames.npy")
            frames = {u: stack[row] for row, u in enumerate(options["frame_units"])}
        return cls(
            audio=np.load(scenario_dir / "user_audio.npy").astype(np.float32),
            ref_audio=np.load(scenario_dir / "ref_audio.npy").astype(np.float32),
            system_prompt=options["system_prompt"],
            frames=frames,
            force_listen_units=set(options["force_listen_units"]),
        )


def run_calls(runner: DuplexRunner, calls: list[RecordedCall]) -> list[list[dict]]:
    """Run ``calls`` side by side as the engine does (each unit's finalize deferred to the next prefill).

    Returns each call's unit records.
    """
    parts = runner.parts
    sessions = []
    for call in calls:
        session = runner.new_session()
        runner.prepare(session, call.system_prompt, call.ref_audio)
        sessions.append(session)
    results: list[list] = [[] for _ in calls]
    for u in range(max(c.units for c in calls)):
        live = [i for i, c in enumerate(calls) if u < c.units]
        jobs = []
        for i in live:
            call = calls[i]
            frame = call.frames.get(u)
            embeds = None if frame is None else parts.vision.embed_frame(frame)
            jobs.append((sessions[i], call.audio[u * UNIT_SAMPLES : (u + 1) * UNIT_SAMPLES], embeds))
        runner.prefill_many(jobs)
        decided = runner.generate_many([(sessions[i], u in calls[i].force_listen_units) for i in live])
        for i, result in zip(live, decided, strict=True):
            results[i].append(result)
    for session in sessions:
        runner.finalize(session)  # the last unit's close (the others closed in the next prefill)
    return [[unit_record(r, parts.tokenizer) for r in call_results] for call_results in results]
