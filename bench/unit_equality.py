"""Greedy equality of the unit runners in bf16 (issue 12): the eager runner against the fast one alone, the fast
one with the session ticked beside three others, and both on the same history (``unit_gpu.py`` reports it;
``tests/gpu/test_unit_bf16_equality.py`` asserts it)."""

from __future__ import annotations

import numpy as np

from bench.unit_sessions import one_session, tick
from bench.unit_workload import make_audio


def forced_agreement(eager, fast, seed: int = 21) -> dict:
    """Both runners on the same history: the eager one decides 30 units freely, keeping each decided id and its
    raw top-2 margin; the fast one then runs the same inputs with every decision replaced by the eager one's, so
    the two always see the same history, and keeps what it would have chosen. Free-running equality ends at the
    first flip (the histories part); this counts every step, and a flip at a near tie shows a small margin."""
    chunk_eos = eager.ids.chunk_eos
    decided: list[tuple[int, float]] = []
    eager_decode = eager._decode

    def record(session, logits, margins):
        token = eager_decode(session, logits, margins)
        decided.append((token, margins[-1]))
        return token

    fast_decode, forced, steps = fast._decode, iter(decided), []

    def follow(session, logits, margins):
        token = fast_decode(session, logits, margins)
        want, margin = next(forced)
        steps.append((token, want, margin))
        if token != want:  # keep the repetition history the eager run had (chunk_eos is never kept)
            if token != chunk_eos:
                session.generated_tokens.pop()
            if want != chunk_eos:
                session.generated_tokens.append(want)
        return want

    eager._decode, fast._decode = record, follow  # instance attributes: generate_steps looks them up there
    try:
        one_session(eager, 20, 10, seed)
        one_session(fast, 20, 10, seed)
    finally:
        del eager._decode, fast._decode
    flips = [margin for token, want, margin in steps if token != want]
    return {
        "decision_steps": len(steps),
        "same_id": len(steps) - len(flips),
        "flip_eager_margins": [round(m, 4) for m in flips],
        "median_eager_margin": round(float(np.median([m for _, _, m in steps])), 4) if steps else None,
    }


def session_ids(runner, seeds: list[int], audio_units: int = 20, omni_units: int = 10) -> list[list[list[int]]]:
    """The LLM ids of every unit of ``len(seeds)`` sessions ticked together (one ``one_session`` each when
    alone: the same prompt, reference audio, audio and frame per seed); session k speaks as ``speaks(k, u)``."""
    frame = np.random.default_rng(seeds[0]).integers(0, 256, (448, 448, 3), dtype=np.uint8)
    sessions = [runner.new_session() for _ in seeds]
    audios = [make_audio(audio_units + omni_units, seed) for seed in seeds]
    for session, seed in zip(sessions, seeds, strict=True):
        runner.prepare(session, "Streaming Omni Conversation.", make_audio(2, seed + 1))
    ids: list[list[list[int]]] = [[] for _ in seeds]
    for u in range(audio_units + omni_units):
        results = tick(runner, sessions, audios, frame if u >= audio_units else None, u, list(range(len(seeds))))
        for k, r in enumerate(results):
            ids[k].append(list(r.llm_ids))
    for session in sessions:
        runner.finalize(session)
    return ids


def greedy_equality(eager, fast, seed: int = 21) -> dict:
    """bf16, 30 units (20 audio, 10 omni) with the same inputs: the eager runner, the fast runner with the
    session alone, and the fast runner with the session as one of four ticked together (other calls beside it
    in the batched steps and padded prefills)."""
    want = [u["ids"] for u in one_session(eager, 20, 10, seed=seed)["units"]]
    got = [u["ids"] for u in one_session(fast, 20, 10, seed=seed)["units"]]
    batched = session_ids(fast, [seed, seed + 10, seed + 20, seed + 30])[0]
    same = [a == b for a, b in zip(want, got, strict=True)]
    listen = eager.ids.listen
    out = {
        "units": len(same),
        "units_with_identical_ids": int(sum(same)),
        "first_difference_unit": same.index(False) if False in same else None,
        "units_with_same_decision": sum((listen in w) == (listen in g) for w, g in zip(want, got, strict=True)),
        "units_speaking": sum(listen not in w for w in want),
        "ids_compared": sum(len(w) for w in want),
        "batched_units_with_identical_ids": sum(a == b for a, b in zip(want, batched, strict=True)),
        "eager_ids": want,
        "fast_ids": got,
    }
    print("equality", {k: v for k, v in out.items() if k not in ("eager_ids", "fast_ids")}, flush=True)
    out["same_history"] = forced_agreement(eager, fast)
    print("same history", out["same_history"], flush=True)
    return out
