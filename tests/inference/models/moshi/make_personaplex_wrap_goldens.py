"""Writes ``tests/data/personaplex_wrap``: reference goldens of PersonaPlex sessions that outlive the context.

Needs ``.venv-personaplex-ref`` (``scripts/install-personaplex-ref.sh`` with ``PARLEY_PERSONAPLEX_SRC``).
Run from the repository root with the project venv:

    .venv/bin/python -m tests.inference.models.moshi.make_personaplex_wrap_goldens

Every pack gets a checkpoint regenerated from its seeds (sha256 recorded), user codes drawn from its seed, and
the reference's outputs: its ``.pt`` voice prompt made from ``voice.wav``, its Mimi codes of that wav and of
``user.flac``, and the tokens of every live step of every session (``golden.npy`` [S, T, 17], solo runs).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from tests.inference.models.moshi.moshi_lm_helpers import user_codes
from tests.inference.models.moshi.personaplex_packs import (
    DATA,
    REFERENCE,
    USER_AUDIO,
    VOICE_WAV,
    build_pack,
    reference_available,
    run_reference,
    run_reference_job,
    sha256,
    write_checkpoint,
)

# Three personas of 21, 23 and 27 tokens with the tiny tokenizer; the voice wav gives 13 voice passes,
# so the prefills are 46, 48 and 52 passes long.
SESSIONS = [
    dict(voice="pt", persona="You are a wise teacher.", codes_seed=1),
    dict(voice="wav", persona="Be kind.", codes_seed=2),
    dict(voice="safetensors", persona="Tell me a story.", codes_seed=3),
]

PACKS = {
    # context 24 < every prefill: the KV ring wraps during the persona, then twice more during the call
    "ctx24": dict(lm=dict(context=24), lm_seed=21, mimi={}, mimi_seed=21, live_frames=48),
    # other widths (6 heads of 16, 3 layers, FFN 4x, a 1-layer depformer of 48) and text_card 384;
    # context 64 lies between the prefill and prefill + call: the ring first wraps mid-call
    "wide-text384-ctx64": dict(
        lm=dict(
            dim=96,
            num_heads=6,
            num_layers=3,
            hidden_scale=4,
            text_card=384,
            context=64,
            depformer_dim=48,
            depformer_num_heads=4,
            depformer_num_layers=1,
            depformer_dim_feedforward=192,
        ),
        lm_seed=22,
        mimi={},
        mimi_seed=22,
        live_frames=48,
    ),
    # a Mimi with 8 quantizers (not 16) and a 10-step transformer context, so its KV ring wraps inside the
    # voice wav's encode too; a 2-head, 1-layer LM with context 40
    "mimi-q8-ctx10": dict(
        lm=dict(num_heads=2, num_layers=1, context=40),
        lm_seed=23,
        mimi=dict(quantizer=dict(n_q=8), transformer=dict(context=10)),
        mimi_seed=23,
        live_frames=48,
    ),
}


def main() -> None:
    if not reference_available():
        raise SystemExit(
            ".venv-personaplex-ref is missing: run scripts/install-personaplex-ref.sh with PARLEY_PERSONAPLEX_SRC"
        )
    specs = {}
    for name, pack in PACKS.items():
        print(f"{name}: building the checkpoint and running the reference ...", flush=True)
        spec = dict(pack, sessions=SESSIONS)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            ckpt = write_checkpoint(spec, tmp / "seed-ckpt")
            spec["sha256"] = {f: sha256(ckpt / f) for f in ("model.safetensors", "mimi.safetensors")}
            out = DATA / name
            out.mkdir(parents=True, exist_ok=True)
            codes = np.stack([user_codes(s["codes_seed"], (8, spec["live_frames"])) for s in SESSIONS])
            np.save(out / "user_codes.npy", codes)
            # the reference makes the .pt voice prompt from the wav (a one-step session keeps it) ...
            np.save(tmp / "one.npy", codes[0, :, :1])
            first = dict(voice=str(VOICE_WAV), persona=SESSIONS[0]["persona"], user_codes=str(tmp / "one.npy"))
            first.update(out=str(tmp / "one_out.npy"), voice_pt_out=str(out / "voice_prompt.pt"))
            first.update(voice_codes_out=str(out / "voice_codes.npy"))
            run_reference_job(ckpt, [first], tmp, [dict(audio=str(USER_AUDIO), out=str(out / "user_audio_codes.npy"))])
            # ... then runs every session, solo, with it
            (tmp / "run").mkdir()
            result = run_reference(build_pack(name, spec, tmp / "run"), tmp / "run")
            np.save(out / "golden.npy", result["tokens"])
        specs[name] = spec
        print(f"{name}: golden {result['tokens'].shape}", flush=True)
    (DATA / "packs.json").write_text(json.dumps({"reference": REFERENCE, "packs": specs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
