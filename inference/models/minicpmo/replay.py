"""``python -m inference replay-units``: run the unit loop over recorded audio and write the per-unit record.

The output follows the golden pack's ``golden.json`` schema (greedy text, greedy TTS codes, float32 on CPU),
so a run on the tiny checkpoint can be compared field by field with the pack.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from inference.models.minicpmo.audio_encoder import UNIT_SAMPLES
from inference.models.minicpmo.config import CheckpointError
from inference.models.minicpmo.duplex import FORCE_LISTEN_COUNT, DuplexRunner, UnitResult
from inference.models.minicpmo.loading import load_model
from inference.models.minicpmo.vision import FrameError


class ReplayInputError(ValueError):
    """An input file of the replay is missing or malformed."""


def _unit_list(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        units = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ReplayInputError(f"unit list {text!r} must be comma-separated integers") from exc
    if any(u < 0 for u in units):
        raise ReplayInputError(f"unit list {text!r} has a negative unit")
    return units


def _load_audio(path: str, what: str) -> np.ndarray:
    try:
        audio = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ReplayInputError(f"{what} {path}: not a readable .npy file ({exc})") from exc
    if audio.ndim != 1 or not np.issubdtype(audio.dtype, np.floating):
        raise ReplayInputError(f"{what} {path}: expected float [N] mono 16 kHz, got {audio.dtype} {audio.shape}")
    return audio.astype(np.float32, copy=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument("--checkpoint", required=True, help="MiniCPM-o 4.5 checkpoint directory")
    parser.add_argument("--audio", required=True, help="user audio .npy, float32 [N] 16 kHz")
    parser.add_argument("--ref-audio", required=True, help="LLM reference voice .npy, float32 16 kHz")
    parser.add_argument("--system-prompt", required=True, help="system prompt text")
    parser.add_argument("--frames", help="frames .npy, uint8 [K, H, W, 3]; row k goes to the k-th --frame-units")
    parser.add_argument("--frame-units", help="comma-separated units that get a frame")
    parser.add_argument("--force-listen-units", help="comma-separated units sent with the force-listen override")
    parser.add_argument("--force-listen-count", type=int, default=FORCE_LISTEN_COUNT)
    parser.add_argument("--no-audio", action="store_true", help="skip the TTS (generate_audio false)")
    parser.add_argument("--out", required=True, help="output JSON path")


def unit_record(result: UnitResult, tokenizer) -> dict:
    """One ``units`` entry of golden.json."""
    return {
        "unit": result.unit,
        "prefill_ok": True,
        "prefill_reason": "",
        "prefill_schema": result.prefill_schema,
        "is_listen": result.is_listen,
        "end_of_turn": result.end_of_turn,
        "llm_ids": result.llm_ids,
        "llm_tokens": tokenizer.convert_ids_to_tokens(result.llm_ids),
        "text": result.text,
        "tts_codes": result.tts_codes,
        "raw_top2_margins": [round(m, 5) for m in result.raw_top2_margins],
        "kv_len": result.kv_len,
    }


def replay(args: argparse.Namespace) -> dict:
    """Run the replay and return the record (raises ``ReplayInputError`` / ``CheckpointError``)."""
    user = _load_audio(args.audio, "--audio")
    ref = _load_audio(args.ref_audio, "--ref-audio")
    frame_units = _unit_list(args.frame_units)
    force_units = set(_unit_list(args.force_listen_units))
    n_units = user.shape[0] // UNIT_SAMPLES
    if n_units == 0:
        raise ReplayInputError(f"--audio holds {user.shape[0]} samples, less than one unit ({UNIT_SAMPLES})")
    frames = None
    if frame_units:
        if not args.frames:
            raise ReplayInputError("--frame-units given without --frames")
        try:
            frames = np.load(args.frames, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ReplayInputError(f"--frames {args.frames}: not a readable .npy file ({exc})") from exc
        if frames.ndim != 4 or frames.shape[0] < len(frame_units):
            raise ReplayInputError(f"--frames needs [>= {len(frame_units)}, H, W, 3], got {frames.shape}")

    torch.set_grad_enabled(False)
    parts = load_model(args.checkpoint, device="cpu", dtype=torch.float32)
    runner = DuplexRunner(parts, force_listen_count=args.force_listen_count)
    session = runner.new_session()
    prompt_ids, suffix_ids = runner.prompt_ids(args.system_prompt)
    kv_after_prepare = runner.prepare(session, args.system_prompt, ref)
    units = []
    for u in range(n_units):
        frame_embeds = None
        if u in frame_units:
            frame_embeds = parts.vision.embed_frame(frames[frame_units.index(u)])
        runner.prefill(session, user[u * UNIT_SAMPLES : (u + 1) * UNIT_SAMPLES], frame_embeds)
        runner.generate(session, force_listen=u in force_units, generate_audio=not args.no_audio)
        result = runner.finalize(session)
        units.append(unit_record(result, parts.tokenizer))
    weights = Path(args.checkpoint) / "model.safetensors"
    sha = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None
    return {
        "scenario": Path(args.out).stem,
        "produced_by": "parley inference.models.minicpmo (python -m inference replay-units)",
        "weights": {"checkpoint": str(args.checkpoint), "model_safetensors_sha256": sha},
        "options": {
            "system_prompt": args.system_prompt,
            "n_units": n_units,
            "frame_units": frame_units,
            "force_listen_units": sorted(force_units),
            "force_listen_count": args.force_listen_count,
            "generate_audio": not args.no_audio,
            "tts_greedy": True,
            "decode_mode": "greedy",
            "compute_dtype": "float32",
        },
        "prompt_token_ids": prompt_ids,
        "suffix_token_ids": suffix_ids,
        "kv_after_prepare": kv_after_prepare,
        "units": units,
    }


def run(args: argparse.Namespace) -> int:
    """Replay and write ``--out``; returns the exit status (2 on bad input)."""
    try:
        record = replay(args)
    except (ReplayInputError, CheckpointError, FrameError) as exc:
        print(f"error: {exc}")
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, ensure_ascii=False, indent=1))
    listens = sum(u["is_listen"] for u in record["units"])
    print(f"replayed {len(record['units'])} units ({listens} listen) -> {out}")
    return 0
