"""PersonaPlex sessions that outlive the attention context, token for token against NVIDIA/personaplex 3428dfd.

Three tiny random shapes (``personaplex_packs.py``, ``tests/data/personaplex_wrap/packs.json``): a context
shorter than the prefill, other widths with ``text_card`` 384 and a context that first wraps mid-call, and a
Mimi with 8 quantizers whose own context wraps inside the voice wav. Each has three sessions (a ``.pt``, a
``.wav`` and a ``.safetensors`` voice prompt, different personas and user codes), compared on every live frame:

- always, against the stored reference goldens, run solo and run together as one batch;
- with the ``personaplex_reference`` mark, against the reference package run live on the same checkpoints.

The live reference needs ``.venv-personaplex-ref``. NVIDIA/personaplex is on no package registry, so those tests
run only in ``make test-reference``, which builds it from a checkout named by ``PARLEY_PERSONAPLEX_SRC``;
``make test`` deselects them and checks the stored goldens the reference made.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from inference.models.moshi.config import LMConfig
from tests.inference.models.moshi.personaplex_packs import (
    DATA,
    USER_AUDIO,
    build_pack,
    encode_pcm_personaplex,
    encode_user_audio,
    encode_voice,
    load_specs,
    prefill_passes,
    require_reference,
    run_ours,
    run_reference,
    session_prefill,
)

# dep_q 16 runs 16 depformer passes a frame on CPU; on a shared 2-core machine a pack's reference run or the
# engine test can pass pytest's default 300 s
pytestmark = pytest.mark.timeout(900)
SPECS = load_specs()
MIN_FRAMES_PAST_WRAP = 24


@pytest.fixture(scope="module", params=sorted(SPECS))
def pack(request, tmp_path_factory):
    return build_pack(request.param, SPECS[request.param], tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def golden(pack):
    return np.load(DATA / pack.name / "golden.npy")


@pytest.fixture(scope="module")
def ours_solo(pack):
    with _one_thread():
        return np.stack([run_ours(pack, [row])[0] for row in range(len(pack.spec["sessions"]))])


@pytest.fixture(scope="module")
def ours_batched(pack):
    with _one_thread():
        return run_ours(pack, list(range(len(pack.spec["sessions"]))))


class _one_thread:
    """Module-scoped fixtures run outside the per-test single-thread fixture of conftest.py."""

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


def compare_frames(ours: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert ours.shape == expected.shape, f"{what}: shape {ours.shape} != {expected.shape}"
    for index in np.ndindex(expected.shape[:-1]):
        assert (ours[index] == expected[index]).all(), (
            f"{what}, session/frame {index}: ours {ours[index].tolist()} != reference {expected[index].tolist()}"
        )


def test_every_session_outlives_the_context(pack, golden):
    """The packs test what they claim: each session runs well past the first wrap of its KV ring."""
    config = pack.info.lm
    assert config.personaplex and config.kv_window == config.context - 1
    for s, session in enumerate(pack.spec["sessions"]):
        passes = prefill_passes(pack, session) + golden.shape[1]
        assert passes - config.context >= MIN_FRAMES_PAST_WRAP, f"session {s}: only {passes} passes"
    assert len(np.unique(golden[:, 1:, 1])) > 10  # the agent's codes move: not a constant stream


def test_solo_sessions_equal_reference_goldens(pack, golden, ours_solo):
    compare_frames(ours_solo, golden, f"{pack.name} solo")


def test_batched_sessions_equal_reference_goldens(pack, golden, ours_batched):
    """The three sessions in one batch, each at its own position (their prefills differ in length)."""
    compare_frames(ours_batched, golden, f"{pack.name} batched")


def test_fast_path_equals_reference_goldens(pack, golden):
    """The fast path (its CPU twin: the code the CUDA graphs capture) on three slots of a four-slot ring set,
    each prefilled in turn while the others wait, then live together: same tokens as the reference."""
    from inference.models.moshi.fast.graphs import GraphedLockstep
    from inference.models.moshi.fast.model import FastLM
    from inference.models.moshi.fast.session import live_forced, run_prefill
    from inference.models.moshi.fast.step import FastLockstep
    from inference.models.moshi.gen import SamplingConfig
    from inference.models.moshi.loading import load_lm

    info = pack.info
    slots = [3, 0, 2]  # session i runs in slots[i]; slot 1 stays idle
    with _one_thread():
        ls = FastLockstep(FastLM(load_lm(info.moshi_weights, info.lm)), num_slots=4, max_rows=4,
                          sampling=SamplingConfig(use_sampling=False))  # fmt: skip
        gl = GraphedLockstep(ls, buckets=(1, 2, 4))
        for slot, session in zip(slots, pack.spec["sessions"], strict=True):
            run_prefill(gl.step, ls, [slot], session_prefill(pack, session, ls.ct).frames)
        codes = torch.from_numpy(np.load(DATA / pack.name / "user_codes.npy"))  # [S, 8, T]
        out = []
        for k in range(codes.shape[2]):
            forced, mask = live_forced(info.lm, codes[:, :, k])
            tokens, valid = gl.step(torch.tensor(slots), forced, mask)
            assert bool(valid.all())
            out.append(tokens.clone())
    compare_frames(torch.stack(out, dim=1).numpy().astype(np.int64), golden, f"{pack.name} fast path")


@pytest.mark.gpu
@pytest.mark.parametrize("pack", ["ctx24", "mimi-q8-ctx10"], indirect=True)  # Triton needs power-of-2 head dims
def test_graphed_fast_path_on_cuda_equals_reference_goldens(pack, golden):
    """The production path: CUDA graphs of the fast step (Triton attention over the smaller ring), fp32, three
    sessions in slots of a 64-slot ring set, prefilled in turn, then live together at bucket 4 with an idle row."""
    from inference.models.moshi.fast.graphs import GraphedLockstep
    from inference.models.moshi.fast.model import FastLM
    from inference.models.moshi.fast.session import live_forced, run_prefill
    from inference.models.moshi.fast.step import FastLockstep
    from inference.models.moshi.gen import SamplingConfig
    from inference.models.moshi.loading import load_lm

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    info = pack.info
    lm = load_lm(info.moshi_weights, info.lm, device="cuda", dtype=torch.float32)
    ls = FastLockstep(FastLM(lm), num_slots=64, max_rows=4, sampling=SamplingConfig(use_sampling=False))
    gl = GraphedLockstep(ls, buckets=(1, 4))
    gl.capture()
    slots = [63, 0, 17]
    for slot, session in zip(slots, pack.spec["sessions"], strict=True):
        ls.reset_slot(slot)
        run_prefill(gl.step, ls, [slot], session_prefill(pack, session, ls.ct, reference_wav_codes=True).frames)
    codes = torch.from_numpy(np.load(DATA / pack.name / "user_codes.npy")).cuda()
    out = []
    for k in range(codes.shape[2]):
        forced, mask = live_forced(info.lm, codes[:, :, k])
        out.append(gl.step(torch.tensor(slots, device="cuda"), forced, mask)[0].clone())
    compare_frames(torch.stack(out, dim=1).cpu().numpy().astype(np.int64), golden, f"{pack.name} CUDA graphs")


def test_wav_voice_codes_equal_reference_mimi(pack):
    """Our Mimi codes of the voice wav equal the reference Mimi's (whose KV ring wraps in ``mimi-q8-ctx10``)."""
    expected = np.load(DATA / pack.name / "voice_codes.npy")
    np.testing.assert_array_equal(encode_voice(pack.info, pack.voices["wav"]), expected)


def test_user_audio_codes_equal_reference_mimi(pack):
    """A 6 s user recording through our Mimi (PersonaPlex's window) gives the reference Mimi's codes; on
    ``mimi-q8-ctx10`` its ring wraps every 9 steps, and moshi 0.2.13's window gives other codes there."""
    expected = np.load(DATA / pack.name / "user_audio_codes.npy")
    np.testing.assert_array_equal(encode_user_audio(pack.info, USER_AUDIO), expected)


def test_goldens_catch_moshis_window(monkeypatch, tmp_path):
    """Control: with moshi 0.2.13's full window (what Parley did before), the tokens equal the goldens until the
    first pass that would still see the oldest frame (position ``context - 1``), and differ from there on."""
    name = "wide-text384-ctx64"
    pack = build_pack(name, SPECS[name], tmp_path)
    golden = np.load(DATA / name / "golden.npy")[0]
    monkeypatch.setattr(LMConfig, "kv_window", property(lambda c: c.context))
    with _one_thread():
        ours = run_ours(pack, [0])[0]
    # live step k is the pass at position prefill + k; its delayed rows come back in row k, text and cb0 in k + 1
    first = pack.info.lm.context - 1 - prefill_passes(pack, pack.spec["sessions"][0])
    assert 0 < first < len(golden) - MIN_FRAMES_PAST_WRAP
    compare_frames(ours[:first], golden[:first], f"{name} before the wrap, moshi window")
    assert not (ours[first:] == golden[first:]).all()


@pytest.fixture(scope="module")
def reference_run(pack, tmp_path_factory):
    require_reference()
    return run_reference(pack, tmp_path_factory.mktemp(f"{pack.name}-reference"))


@pytest.mark.personaplex_reference
def test_live_reference_equals_ours_solo_and_batched(pack, golden, ours_solo, ours_batched, reference_run):
    expected = reference_run["tokens"]
    compare_frames(ours_solo, expected, f"{pack.name} solo vs live reference")
    compare_frames(ours_batched, expected, f"{pack.name} batched vs live reference")
    np.testing.assert_array_equal(expected, golden)  # the stored goldens are what the reference gives today


@pytest.mark.personaplex_reference
def test_live_reference_voice_prompt_and_mimi_codes(pack, reference_run):
    """The reference makes the stored ``.pt`` again from the wav, and its Mimi codes of the wav equal ours."""
    made = torch.load(reference_run["voice_pt"], weights_only=True)
    stored = torch.load(pack.voices["pt"], weights_only=True)
    assert torch.equal(made["embeddings"], stored["embeddings"]) and torch.equal(made["cache"], stored["cache"])
    np.testing.assert_array_equal(encode_voice(pack.info, pack.voices["wav"]), reference_run["voice_codes"])
    np.testing.assert_array_equal(encode_user_audio(pack.info, USER_AUDIO), reference_run["user_audio_codes"])


def test_engine_sessions_past_the_wrap_equal_offline_replay(tmp_path):
    """The lockstep engine on the ``mimi-q8-ctx10`` pack (LM context 40 < prefill; Mimi context 10 steps):
    a ``.wav`` session, a ``.pt`` session joining while the first talks (prefill riding along its live ticks),
    then an instant start of the ``.pt`` start on the first slot. Each session's text, every live tick, equals
    the offline replay of its own audio, which equals the reference past the wrap (tests above)."""
    from inference.engines.base import SlotConfig, SlotInput, VoiceRef
    from inference.engines.lockstep import LockstepEngine
    from inference.models.moshi.replay import replay
    from tests.inference.models.moshi.test_lockstep_engine import speech_like

    name, frames = "mimi-q8-ctx10", 36
    pack = build_pack(name, SPECS[name], tmp_path)
    sessions = [("wav", "Be kind."), ("pt", "You are a wise teacher."), ("pt", "You are a wise teacher.")]
    audio = [speech_like(10 + i, frames) for i in range(len(sessions))]
    with _one_thread():
        engine = LockstepEngine(pack.ckpt, 2, greedy=True, prefill_budget_ms=0.0)  # one prefill pass per tick
        engine.warmup()
        texts: list[list[str]] = [[] for _ in sessions]
        where = {0: 0}  # slot -> session
        engine.open_slot(0, SlotConfig(persona=sessions[0][1], voice=VoiceRef("wav", pack.voices["wav"])))
        for tick in range(400):
            if tick == 3:
                engine.open_slot(1, SlotConfig(persona=sessions[1][1], voice=VoiceRef("pt", pack.voices["pt"])))
                where[1] = 1
            if where.get(0) == 0 and len(texts[0]) == frames:  # the first session ends; the third starts
                engine.close_slot(0)
                engine.open_slot(0, SlotConfig(persona=sessions[2][1], voice=VoiceRef("pt", pack.voices["pt"])))
                assert engine._slots[0].live, "the same start as slot 1's: an instant start from its snapshot"
                where[0] = 2
            inputs = {}
            for slot, s in where.items():
                if engine._slots[slot].live and len(texts[s]) < frames:
                    k = len(texts[s])
                    inputs[slot] = SlotInput(audio=audio[s][k * 1920 : (k + 1) * 1920])
            out = engine.step(inputs)
            for slot in inputs:
                texts[where[slot]].append(out[slot].text)
            if all(len(t) == frames for t in texts):
                break
        assert [len(t) for t in texts] == [frames] * len(sessions)
        info = pack.info
        for s, (kind, persona) in enumerate(sessions):
            codes = encode_pcm_personaplex(info, audio[s])
            expected = replay(info, codes, greedy=True, voice_prompt=pack.voices[kind], persona=persona)
            assert texts[s] == [engine.detokenizer.piece(int(t)) for t in expected[:, 0]], f"session {s}"
    assert len({"".join(t) for t in texts}) == len(texts)  # different audio / starts give different text


def test_seeded_checkpoints_are_the_same_file_on_the_portable_cpu_kernels(tmp_path):
    """The packs' weights are regenerated, not stored, so they must not depend on the CPU: the same seed gives
    the same LM and Mimi files under ATen's portable kernels (``torch.randn`` did not: its Box-Muller is
    vectorised differently per kernel)."""
    import os
    import subprocess
    import sys

    from tests.inference.models.moshi.moshi_lm_helpers import ROOT
    from tests.inference.models.moshi.personaplex_packs import sha256, write_checkpoint

    spec = SPECS["mimi-q8-ctx10"]
    here = write_checkpoint(spec, tmp_path / "here")
    script = (
        "import json, sys; from pathlib import Path; "
        "from tests.inference.models.moshi.personaplex_packs import write_checkpoint; "
        "write_checkpoint(json.loads(sys.argv[1]), Path(sys.argv[2]))"
    )
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", MKL_CBWR="COMPATIBLE")
    cmd = [sys.executable, "-c", script, json.dumps(spec), str(tmp_path / "portable")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for file in ("model.safetensors", "mimi.safetensors"):
        assert sha256(tmp_path / "portable" / file) == sha256(here / file) == spec["sha256"][file], file
