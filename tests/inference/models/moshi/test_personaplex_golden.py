"""PersonaPlex (dep_q 16) against the reference golden pack: voice prompt, persona prefill, teacher forcing.

The pack (tests/data/personaplex, copied from shared/golden/personaplex) was produced by NVIDIA/personaplex
3428dfd9 in fp32 on CPU, greedy. See its README for the step semantics.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm
import torch

from inference.models.moshi.config import read_checkpoint_dir
from inference.models.moshi.gen import LockstepGen, SamplingConfig
from inference.models.moshi.loading import load_lm
from inference.models.moshi.personaplex import (
    SILENCE_TOKENS,
    SINE_TOKENS,
    TEXT_PAD,
    build_prefill,
    load_voice_prompt,
    persona_tokens,
    voice_frames_from_prompt,
)
from inference.models.moshi.replay import live_steps, replay, run_prefill
from inference.models.moshi.text import TextDetokenizer
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA, ROOT

DATA = PERSONAPLEX_DATA
GOLDEN = json.loads((DATA / "golden.json").read_text())


@pytest.fixture(scope="module")
def info():
    return read_checkpoint_dir(DATA / "ckpt")


@pytest.fixture(scope="module")
def persona():
    return (DATA / "persona.txt").read_text()


@pytest.mark.parametrize("voice", ["voice_prompt.pt", "voice_prompt.safetensors", "voice_prompt.wav"])
def test_replay_reproduces_golden(info, persona, voice):
    golden = np.load(DATA / "golden.npy")
    out = replay(info, np.load(DATA / "user_codes.npy"), greedy=True, voice_prompt=DATA / voice, persona=persona)
    assert out.shape == golden.shape == (150, 17)
    for k in range(golden.shape[0]):
        assert (out[k] == golden[k]).all(), f"live step {k}: {out[k].tolist()} != golden {golden[k].tolist()}"


def test_replay_cli_writes_golden(tmp_path):
    out = tmp_path / "out.npy"
    cmd = [sys.executable, "-m", "inference", "replay", "--checkpoint", str(DATA / "ckpt")]
    cmd += ["--voice-prompt", str(DATA / "voice_prompt.pt"), "--persona-file", str(DATA / "persona.txt")]
    cmd += ["--user-codes", str(DATA / "user_codes.npy"), "--out", str(out), "--greedy"]
    cmd += ["--device", "cpu", "--dtype", "float32"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    np.testing.assert_array_equal(np.load(out), np.load(DATA / "golden.npy"))


def test_persona_tokens_and_prefill_order(info, persona):
    tok = spm.SentencePieceProcessor(model_file=str(info.tokenizer))
    ids = persona_tokens(tok, persona)
    assert ids == GOLDEN["text_prompt_tokens"]
    assert persona_tokens(tok, "<system> already wrapped <system>") == tok.encode("<system> already wrapped <system>")
    gen_ct = info.lm.max_delay + 3
    prompt = load_voice_prompt(DATA / "voice_prompt.pt", info.lm, gen_ct)
    prefill = build_prefill(info.lm, voice=voice_frames_from_prompt(info.lm, prompt), persona_ids=ids)
    E, n = prompt.embeddings.shape[0], len(ids)
    assert len(prefill) == E + 12 + n == GOLDEN["prefill"]["model_passes"]
    frames = prefill.frames
    # 1. voice: embeddings in order, ring restored after the last one only
    assert all(f.embedding is not None for f in frames[:E])
    assert torch.equal(frames[0].embedding, prompt.embeddings[0, 0])
    assert [f.restore_cache_after is not None for f in frames[:E]] == [False] * (E - 1) + [True]
    silence = torch.tensor([TEXT_PAD, *SILENCE_TOKENS, *SINE_TOKENS])
    # 2. six silence frames, 3. persona tokens one per frame, 4. six silence frames
    for i, f in enumerate(frames[E:]):
        assert f.embedding is None and bool(f.forced_mask.all())
        expected = silence.clone()
        if 6 <= i < 6 + n:
            expected[0] = ids[i - 6]
        assert torch.equal(f.forced, expected), f"prefill frame {E + i}"


def test_state_after_prefill_matches_reference(info, persona):
    lm = load_lm(info.moshi_weights, info.lm)
    gen = LockstepGen(lm, 1, SamplingConfig(use_sampling=False))
    ids = persona_tokens(spm.SentencePieceProcessor(model_file=str(info.tokenizer)), persona)
    prompt = load_voice_prompt(DATA / "voice_prompt.safetensors", info.lm, gen.ct)
    run_prefill(gen, [build_prefill(info.lm, voice=voice_frames_from_prompt(info.lm, prompt), persona_ids=ids)])
    assert int(gen.lengths[0]) + 1 == GOLDEN["prefill"]["offset_after"]
    assert gen.cache[0].tolist() == GOLDEN["prefill"]["token_cache_after"]
    assert gen.provided[0].int().tolist() == GOLDEN["prefill"]["provided_after"]


def test_forced_user_codebooks_change_the_output(info):
    """dep_q 16: the user rows are teacher-forced (echoed), and different user audio changes the agent."""
    lm = load_lm(info.moshi_weights, info.lm)
    codes = torch.from_numpy(np.load(DATA / "user_codes.npy"))[:, :40]
    other = codes.clone()
    other[:, 10:] = (other[:, 10:] + 777) % 2048
    outs = []
    for user in (codes, other):
        gen = LockstepGen(lm, 1, SamplingConfig(use_sampling=False))
        run_prefill(gen, [build_prefill(info.lm, voice=None, persona_ids=[10, 11, 12])])
        outs.append(live_steps(gen, user[None], keep_first=True)[0])
    a, b = outs
    # rows 9..16 of step k are the de-delayed user frame k-1: an echo of the codes given at step k-1
    assert torch.equal(a[1:, 9:17], codes[:, :-1].T)
    # identical until the user codes differ, then the agent's own rows diverge
    assert torch.equal(a[:11], b[:11])
    assert not torch.equal(a[12:, :9], b[12:, :9])


def test_without_forcing_the_user_rows_are_predicted(info):
    """Control for the test above: with the user rows not forced, the model's own predictions come back."""
    lm = load_lm(info.moshi_weights, info.lm)
    gen = LockstepGen(lm, 1, SamplingConfig(use_sampling=False))
    K = info.lm.num_codebooks
    forced = torch.zeros(1, K, dtype=torch.long)
    nothing = torch.zeros(1, K, dtype=torch.bool)
    rows = [gen.step(forced, nothing, torch.ones(1, dtype=torch.bool)).tokens[0] for _ in range(12)]
    predicted = torch.stack(rows[2:])[:, 9:]
    assert (predicted >= 0).all() and (predicted < 2048).all()


def test_detokenised_text_matches_golden_pieces(info):
    tok = TextDetokenizer(spm.SentencePieceProcessor(model_file=str(info.tokenizer)))
    golden = np.load(DATA / "golden.npy")
    for token, piece in zip(golden[:, 0], GOLDEN["text_pieces"], strict=True):
        expected = "" if int(token) in (0, 3) else piece.replace("\u2581", " ")
        assert tok.piece(int(token)) == expected
    assert tok.piece(-2) == "" and tok.piece(10**6) == ""
