"""The checkpoint as a lockstep engine serves it: its configuration at the context a deployment chose
(``PARLEY_LOCKSTEP_CONTEXT``), the capabilities the engine announces for it, and whether a session's prompt fits.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from inference.engines.base import EngineCapabilities, EngineError
from inference.models.moshi.config import CheckpointError, CheckpointInfo, read_checkpoint_dir
from inference.models.moshi.personaplex import FRAME_SAMPLES

SAMPLE_RATE = 24_000
FRAME_MS = 80
DEMO_NOTICE = (
    "Random demo weights: the agent babbles. To serve a real model, set PARLEY_CHECKPOINT to a checkpoint "
    "directory in the Kyutai layout (config.json, model.safetensors, Mimi and tokenizer files), e.g. a local "
    "copy of kyutai/moshiko-pytorch-bf16 or nvidia/personaplex-7b-v1, and PARLEY_ENGINE=moshi or personaplex."
)


def read_served_checkpoint(checkpoint: Path, context: int | None) -> tuple[CheckpointInfo, bool]:
    """The checkpoint's files and configs, its context cut to ``context`` frames when that is shorter (the model as
    if its checkpoint said so: every size and mask derives from ``LMConfig.context``); and whether it was cut.

    Raises:
        EngineError: the directory is not a readable checkpoint.
    """
    try:
        info = read_checkpoint_dir(checkpoint)
    except CheckpointError as exc:
        raise EngineError(f"cannot use checkpoint {checkpoint}: {exc}") from exc
    shortened = bool(context) and context < info.lm.context
    if shortened:
        info = replace(info, lm=replace(info.lm, context=context))
    return info, shortened


def lockstep_capabilities(info: CheckpointInfo) -> EngineCapabilities:
    lm = info.lm
    demo = info.demo_weights
    extra = {
        "dep_q": lm.dep_q,
        "persona": lm.personaplex,
        "voice_prompt": lm.personaplex,
        "demo_weights": demo,
        "context_s": lm.kv_window * FRAME_MS / 1000,  # what the model hears of a call, at most
    }
    if demo:
        extra["demo_notice"] = DEMO_NOTICE
    return EngineCapabilities(
        engine="personaplex" if lm.personaplex else "moshi",
        family="lockstep",
        chunk_period_ms=FRAME_MS,
        input_rate=SAMPLE_RATE,
        input_chunk_samples=FRAME_SAMPLES,
        output_rate=SAMPLE_RATE,
        barge_in=False,
        demo_weights=demo,
        extra=extra,
    )


def check_prompt_fits(info: CheckpointInfo, prefill_frames: int, shortened: bool) -> None:
    """Refuse a prompt longer than a context the deployment shortened: it would slide out before the call began.
    At a checkpoint's own context it wraps as in the reference (test_personaplex_wrap).

    Raises:
        EngineError: the voice prompt and persona do not fit the shortened context.
    """
    if shortened and prefill_frames >= info.lm.kv_window:
        raise EngineError(
            f"the voice prompt and persona take {prefill_frames * FRAME_MS / 1000:.1f} s, and this engine's context "
            f"is {info.lm.kv_window * FRAME_MS / 1000:.1f} s (PARLEY_LOCKSTEP_CONTEXT): use a shorter "
            "voice prompt or persona"
        )
