"""Tiny-model edits that steer the MiniCPM-o decisions into paths no golden call takes, for fast == eager tests.

Each edits a deep copy's weights (never the shared fixture's) so that a path becomes common: listen chosen mid-turn
(re-fed as tts_bos), units running to the 19-id cap, TTS units stopping at different codes. Shared by the CPU tests
(tests/inference/models/minicpmo/test_fast_path.py) and their graphed twins (tests/gpu/test_fast_unit.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from inference.models.minicpmo.duplex import DuplexRunner
from inference.models.minicpmo.fast.streams import RecordedCall
from inference.models.minicpmo.tts import MIN_NEW_CODES, TTSState

SCENARIOS = ("audio8", "omni6", "turnclose10")
FREQUENT_TEXT_ID = 109604  # the goldens' most frequent text id: a row whose logit is often high


def golden_calls(data_dir: Path) -> tuple[list[dict], list[RecordedCall]]:
    goldens = [json.loads((data_dir / s / "golden.json").read_text()) for s in SCENARIOS]
    calls = [RecordedCall.from_scenario(data_dir / s, g["options"]) for s, g in zip(SCENARIOS, goldens, strict=True)]
    return goldens, calls


def listen_likely(parts):
    """A copy whose ``<|listen|>`` row tracks a frequent text id: chosen mid-turn many times (becoming tts_bos)."""
    parts = copy.deepcopy(parts)
    ids = DuplexRunner(parts).ids
    head = parts.llm.llm.lm_head.weight
    head[ids.listen] = 1.02 * head[FREQUENT_TEXT_ID]
    return parts


def run_to_the_cap(parts):
    """A copy that speaks single letters and never listens or ends: units run to the 19-id cap. The letters'
    rows are distinct multiples of one row, spaced so that none ties another after the repetition penalty."""
    parts = copy.deepcopy(parts)
    runner = DuplexRunner(parts)
    ids, head = runner.ids, parts.llm.llm.lm_head.weight
    for token in (ids.listen, ids.chunk_eos, ids.chunk_tts_eos, ids.turn_eos):
        head[token].zero_()
    letters = [i for i in range(300) if len(runner.tok.decode([i])) == 1 and runner.tok.decode([i]).isalpha()][:40]
    for k, token in enumerate(letters):
        head[token] = 1.5 * 1.013**k * head[FREQUENT_TEXT_ID]
    return parts


def early_stopping_tts(parts) -> tuple:
    """A copy of the TTS whose eos tracks one frequent code, and 8 conditions that stop after 3 to 25 codes (the
    last with eos masked for the whole unit): (tts, conditions, min_new_codes)."""
    tts = copy.deepcopy(parts.tts)
    head = tts.head_code[0].weight
    head[tts.eos] = 1.02 * head[591]
    device = head.device
    conditions = []
    for k in range(8):
        hidden = torch.randn(3 + k, parts.llm.hidden_size, generator=torch.Generator().manual_seed(k)).to(device)
        conditions.append(tts.condition(list(range(10, 13 + k)), hidden))
    return tts, conditions, [0] * 7 + [MIN_NEW_CODES]


def two_units_fast_and_eager(fast, tts, conditions, min_codes) -> set[int]:
    """Two units of one turn per condition, on the batched ``fast`` TTS and on the eager ``tts`` one at a time;
    asserts the same codes and positions and returns the code counts seen."""
    states, eager_states = [fast.new_state() for _ in conditions], [TTSState() for _ in conditions]
    lengths = set()
    for unit in range(2):
        got = fast.generate_units(states, conditions, min_codes)
        want = [tts.generate_unit(s, c, m) for s, c, m in zip(eager_states, conditions, min_codes, strict=True)]
        assert got == want, f"unit {unit}"
        assert [s.pos for s in states] == [s.pos for s in eager_states]
        lengths |= {len(codes) for codes in got}
    return lengths
