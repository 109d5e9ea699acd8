"""The unit engine holds a slot to one side in turn-based modes (SlotInput.turn), on the eager and fast paths.

``listen``: every unit listens, although the same audio in a free (duplex) slot makes the random model
speak. ``respond``: the model speaks from the first unit on and keeps speaking until it ends its turn.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.engines.base import SlotConfig, SlotInput
from inference.engines.unit import UnitEngine


@pytest.mark.parametrize("fast", [False, True])
def test_listen_and_respond_turns(minicpmo_checkpoint, minicpmo_data_dir, fast):
    audio = np.load(minicpmo_data_dir / "audio8" / "user_audio.npy").astype(np.float32)
    engine = UnitEngine(minicpmo_checkpoint, num_slots=2, fast=fast)
    engine.warmup()
    for slot in (0, 1):
        engine.open_slot(slot, SlotConfig())
    while any(out.prefilling for out in engine.step({}).values()):  # the prepares may take more than one tick
        pass
    held, free = [], []
    for u in range(7):
        chunk = audio[u * 16000 : (u + 1) * 16000]
        out = engine.step({0: SlotInput(audio=chunk, turn="listen"), 1: SlotInput(audio=chunk)})
        held.append(out[0].decision)
        free.append(out[1].decision)
    assert set(held) == {"listen"}, held
    assert "speak" in free[3:], free  # the same audio, undirected, makes this model speak
    answered = []
    for _ in range(6):
        out = engine.step({0: SlotInput(audio=np.zeros(16000, np.float32), turn="respond")})[0]
        answered.append((out.decision, out.end_of_turn))
        if out.end_of_turn:
            break
    assert answered[0][0] == "speak" and all(d == "speak" for d, _ in answered), answered
    for slot in (0, 1):
        engine.close_slot(slot)
