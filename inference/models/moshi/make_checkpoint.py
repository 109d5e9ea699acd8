"""``python -m inference make-checkpoint``: a tiny random Moshi / PersonaPlex checkpoint directory.

The directory has exactly the published layout: ``config.json`` (LM kwargs + file names + ``lm_gen_config``,
marked ``"parley_demo": true``), ``model.safetensors`` (fused LM keys), ``mimi.safetensors`` with
``mimi_config.json`` (a small Mimi), and ``tokenizer.model`` (a SentencePiece model trained in-process).
Every LM parameter is drawn from an explicit ``torch.Generator`` (reference doc §7): RMSNorm gains
``1 + 0.1 n``, everything else ``n / sqrt(fan_in)``, with ``n`` unit noise that is the same on every CPU
(``seeded.unit_noise``), so a seed gives the same file on every machine.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from inference.models.moshi.config import MOSHIKO_DELAYS, LMConfig
from inference.models.moshi.lm import MoshiLM
from inference.models.moshi.seeded import unit_noise

PRESETS: dict[str, dict] = {
    "tiny-moshiko": dict(
        dim=64,
        num_heads=4,
        num_layers=2,
        hidden_scale=4.125,
        n_q=16,
        dep_q=8,
        card=2048,
        text_card=256,
        existing_text_padding_id=3,
        delays=list(MOSHIKO_DELAYS),
        context=500,
        max_period=10000,
        norm="rms_norm_f32",
        gating="silu",
        positional_embedding="rope",
        layer_scale=None,
        causal=True,
        depformer_dim=32,
        depformer_dim_feedforward=132,
        depformer_num_heads=4,
        depformer_num_layers=2,
        depformer_layer_scale=None,
        depformer_multi_linear=True,
        depformer_context=8,
        depformer_max_period=10000,
        depformer_gating="silu",
        depformer_pos_emb="none",
        depformer_weights_per_step=True,
    ),
}
PRESETS["tiny-personaplex"] = dict(PRESETS["tiny-moshiko"], dep_q=16)

LM_GEN_CONFIG = {"temp": 0.8, "temp_text": 0.7, "top_k": 250, "top_k_text": 25}

# A small English corpus for the demo tokenizer; the pieces only need to cover ordinary text.
_CORPUS_WORDS = (
    "you are a wise and friendly teacher answer questions or provide advice in clear engaging way hello "
    "how can i help today the weather is nice what would like to talk about system assistant user voice "
    "listen speak good morning evening thanks thank very much please sorry yes no maybe sure great idea "
    "tell me more story about music science history water river mountain city people time day night one "
    "two three four five six seven eight nine ten first last next call model parley random demo weights"
).split()


def random_lm_state_dict(config: LMConfig, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter of a ``MoshiLM(config)`` drawn from ``torch.Generator().manual_seed(seed)`` (fp32).

    Keys are visited in sorted order, so the values depend only on (config, seed).
    """
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in MoshiLM(config).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for key in sorted(shapes):
        shape = shapes[key]
        noise = unit_noise(shape, gen)
        if key.endswith("alpha"):
            state[key] = 1.0 + 0.1 * noise
        else:
            state[key] = noise / (shape[-1] ** 0.5)
    return state


def write_lm_checkpoint(out: Path, lm_kwargs: dict, seed: int, *, demo: bool = True) -> LMConfig:
    """Write config.json (LM part + file names) and model.safetensors; returns the parsed config."""
    out.mkdir(parents=True, exist_ok=True)
    config = LMConfig.from_lm_kwargs(lm_kwargs)
    save_file(random_lm_state_dict(config, seed), str(out / "model.safetensors"))
    raw = dict(lm_kwargs)
    raw.update(
        moshi_name="model.safetensors",
        mimi_name="mimi.safetensors",
        tokenizer_name="tokenizer.model",
        mimi_config_name="mimi_config.json",
        model_type="moshi",
        lm_gen_config=dict(LM_GEN_CONFIG),
    )
    if demo:
        raw["parley_demo"] = True
    (out / "config.json").write_text(json.dumps(raw, indent=1))
    return config


def train_tokenizer(path: Path, vocab_size: int, seed: int) -> None:
    """Train a unigram SentencePiece model with ids 0 <unk>, 1 <s>, 2 </s>, 3 <pad> (the text PAD)."""
    import random

    import sentencepiece as spm

    rng = random.Random(seed)
    # pseudo-words from syllables give the unigram trainer enough distinct pieces to fill the vocabulary
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = list(_CORPUS_WORDS) + ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(600)]
    sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(4000)]
    sentences += ["<system> " + s + " <system>" for s in sentences[:200]]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())


def write_mimi(out: Path, seed: int) -> None:
    """The small Mimi config and its random weights (Kyutai key layout), from helper M2's module."""
    from inference.models.moshi.mimi_config import MimiConfig
    from inference.models.moshi.mimi_loading import random_mimi_state_dict

    mimi_config = MimiConfig.tiny()
    (out / "mimi_config.json").write_text(json.dumps(mimi_config.to_dict(), indent=1))
    save_file(random_mimi_state_dict(mimi_config, seed), str(out / "mimi.safetensors"))


def make_checkpoint(preset: str, out: Path, seed: int) -> Path:
    """Write a whole tiny checkpoint directory; returns it."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = write_lm_checkpoint(out, PRESETS[preset], seed)
    train_tokenizer(out / "tokenizer.model", config.text_card, seed)
    write_mimi(out, seed)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny-moshiko")
    parser.add_argument("--out", type=Path, required=True, help="directory to write (created if needed)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    out = make_checkpoint(args.preset, args.out, args.seed)
    print(f"wrote {args.preset} (seed {args.seed}) to {out}: RANDOM demo weights, not a trained model")
    return 0
