"""``python -m inference replay``: run the lockstep model offline on recorded user codes (or audio).

Moshi checkpoints (dep_q < n_q): IN int64 ``[8, T]`` or ``[B, 8, T]`` -> OUT ``[T-1, 1+dep_q]`` or
``[B, T-1, 1+dep_q]``, the stacked non-None outputs of moshi 0.2.13 ``LMGen.step``.
PersonaPlex checkpoints (dep_q == n_q) with ``--voice-prompt`` / ``--persona-file``: the session prefill, then
one live step per column, OUT ``[T, 17]`` (one row per live step, as the PersonaPlex golden pack).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from inference.models.moshi.config import CheckpointInfo, read_checkpoint_dir
from inference.models.moshi.gen import LockstepGen, SamplingConfig
from inference.models.moshi.loading import load_lm
from inference.models.moshi.personaplex import (
    Prefill,
    build_prefill,
    load_voice_prompt,
    persona_tokens,
    stream_encode,
    voice_frames_from_codes,
    voice_frames_from_prompt,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ReplayError(ValueError):
    """Bad replay input (codes file, shapes, options)."""


def check_user_codes(codes: np.ndarray, card: int) -> np.ndarray:
    """Validate user codes: integer [8, T] or [B, 8, T] with values in 0..card-1 and T >= 1."""
    if not np.issubdtype(codes.dtype, np.integer):
        raise ReplayError(f"user codes must be integers, got {codes.dtype}")
    if codes.ndim not in (2, 3) or codes.shape[-2] != 8 or codes.shape[-1] < 1:
        raise ReplayError(f"user codes must be [8, T] or [B, 8, T], got {codes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() >= card):
        raise ReplayError(f"user codes must be in 0..{card - 1}")
    return codes.astype(np.int64)


def run_prefill(gen: LockstepGen, prefills: list[Prefill | None]) -> None:
    """Run each row's prefill through batched steps (rows with shorter prefills are frozen meanwhile)."""
    B, K = gen.batch_size, gen.config.num_codebooks
    longest = max((len(p) for p in prefills if p is not None), default=0)
    for i in range(longest):
        forced = torch.zeros(B, K, dtype=torch.long)
        mask = torch.zeros(B, K, dtype=torch.bool)
        exec_mask = torch.zeros(B, dtype=torch.bool)
        emb = torch.zeros(B, 1, gen.config.dim)
        use_emb = torch.zeros(B, dtype=torch.bool)
        restores = []
        for row, p in enumerate(prefills):
            if p is None or i >= len(p):
                continue
            f = p.frames[i]
            forced[row], mask[row], exec_mask[row] = f.forced, f.forced_mask, True
            if f.embedding is not None:
                emb[row], use_emb[row] = f.embedding, True
            if f.restore_cache_after is not None:
                restores.append((row, f.restore_cache_after))
        dev = gen.device
        gen.step(forced.to(dev), mask.to(dev), exec_mask.to(dev), emb.to(dev), use_emb.to(dev))
        for row, cache in restores:
            gen.restore_token_cache(row, cache)


def live_steps(gen: LockstepGen, user_codes: torch.Tensor, *, keep_first: bool) -> torch.Tensor:
    """One step per column of ``user_codes`` [B, 8, T]; returns [B, T', 1+dep_q] (T' = T, or T-1 for Moshi)."""
    B, K = gen.batch_size, gen.config.num_codebooks
    dev = gen.device
    mask = torch.zeros(B, K, dtype=torch.bool, device=dev)
    mask[:, K - 8 :] = True
    exec_mask = torch.ones(B, dtype=torch.bool, device=dev)
    forced = torch.zeros(B, K, dtype=torch.long, device=dev)
    outs = []
    for t in range(user_codes.shape[2]):
        forced[:, K - 8 :] = user_codes[:, :, t]
        out = gen.step(forced, mask, exec_mask)
        if keep_first or t > 0:
            outs.append(out.tokens.clone())
    return torch.stack(outs, dim=1).cpu()


def replay(
    info: CheckpointInfo,
    user_codes: np.ndarray,
    *,
    greedy: bool = True,
    device: str = "cpu",
    dtype: str = "float32",
    voice_prompt: Path | None = None,
    persona: str | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Replay ``user_codes`` ([8, T] or [B, 8, T]) on the checkpoint; see the module docstring for shapes."""
    config = info.lm
    if dtype not in DTYPES:
        raise ReplayError(f"dtype must be one of {', '.join(DTYPES)}")
    codes = check_user_codes(user_codes, config.card)
    if (voice_prompt is not None or persona is not None) and not config.personaplex:
        raise ReplayError("--voice-prompt / --persona-file need a PersonaPlex checkpoint (dep_q == n_q)")
    squeeze = codes.ndim == 2
    batch = torch.from_numpy(codes[None] if squeeze else codes).to(device)
    lm = load_lm(info.moshi_weights, config, device=device, dtype=DTYPES[dtype])
    sampling = SamplingConfig.from_lm_gen_config(info.lm_gen_config, greedy=greedy)
    generator = torch.Generator(device=device).manual_seed(seed)
    gen = LockstepGen(lm, batch.shape[0], sampling, generator)
    if config.personaplex:
        prefill = _personaplex_prefill(info, gen, voice_prompt, persona, device)
        run_prefill(gen, [prefill] * gen.batch_size)
    out = live_steps(gen, batch, keep_first=config.personaplex).numpy().astype(np.int64)
    return out[0] if squeeze else out


def _personaplex_prefill(info: CheckpointInfo, gen: LockstepGen, voice_prompt, persona, device) -> Prefill:
    config = info.lm
    voice = None
    if voice_prompt is not None:
        voice_prompt = Path(voice_prompt)
        if voice_prompt.suffix.lower() == ".wav":
            voice = voice_frames_from_codes(config, encode_voice_wav(info, voice_prompt, device))
        else:
            voice = voice_frames_from_prompt(config, load_voice_prompt(voice_prompt, config, gen.ct))
    ids = None
    if persona is not None:
        import sentencepiece as spm

        ids = persona_tokens(spm.SentencePieceProcessor(model_file=str(info.tokenizer)), persona)
    return build_prefill(config, voice=voice, persona_ids=ids)


def encode_voice_wav(info: CheckpointInfo, path: Path, device: str) -> np.ndarray:
    """Mimi codes [8, F] of a voice-prompt wav: normalised to -24 LUFS first, as the reference does."""
    from inference.models.moshi.audio_prep import load_voice_wav

    return encode_pcm(info, load_voice_wav(path), device)


def encode_user_wav(info: CheckpointInfo, path: Path, device: str) -> np.ndarray:
    """Mimi codes [8, F] of a user recording (24 kHz mono after resampling, no loudness change)."""
    from inference.models.moshi.audio_prep import load_wav_24k

    return encode_pcm(info, load_wav_24k(path), device)


def encode_pcm(info: CheckpointInfo, pcm: np.ndarray, device: str) -> np.ndarray:
    """Streaming Mimi encode of float32 24 kHz ``pcm`` in 1920-sample frames (last one zero-padded), with the
    attention window of the checkpoint's reference (the NVIDIA/personaplex fork's for PersonaPlex)."""
    from inference.models.moshi.mimi_config import MimiConfig
    from inference.models.moshi.mimi_loading import load_mimi

    mimi_config = MimiConfig.from_dict(info.mimi_config) if info.mimi_config else MimiConfig.kyutai_default()
    codec = load_mimi(info.mimi_weights, mimi_config, num_codebooks=8, device=device, dtype=torch.float32)
    return torch.stack(list(stream_encode(codec, pcm, personaplex=info.lm.personaplex)), dim=1).numpy()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, required=True, help="checkpoint directory (Kyutai layout)")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--user-codes", type=Path, help="int64 .npy [8, T] or [B, 8, T]")
    src.add_argument("--user-audio", type=Path, help="24 kHz wav, Mimi-encoded first")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--greedy", action="store_true", help="argmax decoding (default: sampling)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--voice-prompt", type=Path, help="PersonaPlex voice prompt (.pt, .safetensors or .wav)")
    parser.add_argument("--persona-file", type=Path, help="PersonaPlex persona text file (no tags)")


def run(args: argparse.Namespace) -> int:
    if args.device == "cpu":
        torch.set_num_threads(1)  # tiny/latency-bound steps: intra-op threads only add spin contention
    try:
        info = read_checkpoint_dir(args.checkpoint)
        if args.user_codes is not None:
            try:
                codes = np.load(args.user_codes, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise ReplayError(f"{args.user_codes}: not a readable .npy file ({exc})") from exc
        else:
            codes = encode_user_wav(info, args.user_audio, args.device)
        persona = None
        if args.persona_file is not None:
            try:
                persona = args.persona_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ReplayError(f"{args.persona_file}: not a readable text file ({exc})") from exc
        out = replay(
            info,
            codes,
            greedy=args.greedy,
            device=args.device,
            dtype=args.dtype,
            voice_prompt=args.voice_prompt,
            persona=persona,
            seed=args.seed,
        )
    except ValueError as exc:  # CheckpointError, ReplayError, VoicePromptError, AudioPrepError
        print(f"replay: error: {exc}")
        return 2
    np.save(args.out, out)
    print(f"replay: wrote {args.out} {tuple(out.shape)}")
    return 0
