"""Token2Wav chunks of several streams batched (``Token2WavModel.chunk_many``, ``Token2WavVocoder.synthesize_many``)
against the same chunks run stream by stream: audio, mel and every stream's state afterwards.

The streams use the reference's prompts (``reference.npz``, as test_token2wav.py), copies of them with other speaker
embeddings (so a batch mixes voices) and a shorter cut of one (prompts of three lengths: some streams never share a
batch, others do at other stages).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from inference.models.minicpmo.token2wav.flow import FlowCache
from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets
from inference.models.minicpmo.token2wav.stream import PromptFeatures, Token2WavModel, Token2WavStream
from inference.models.minicpmo.vocoder import SilentVocoder, Token2WavVocoder

pytestmark = pytest.mark.usefixtures("single_torch_thread")  # tests/conftest.py

REFERENCE = Path(__file__).resolve().parents[3] / "data" / "minicpmo45" / "token2wav" / "reference.npz"
# Batched vs per stream, measured with scripts/float-spread.sh over its 14 CPU code paths here (MKL branches, ATen
# capabilities, oneDNN ISA, 1-8 threads): the mel moved by at most 3.8e-6, the audio by 1.4e-4, the caches and
# tails by 7.9e-5 (a batch's matmuls split their sums otherwise; HiFT's exp/iSTFT amplify the mel's last bits).
# The tolerances are 7-13x those; a row given another stream's state, noise or tail moves its audio by ~1 (RMS ~0.7).
MEL_ATOL, AUDIO_ATOL, STATE_ATOL = 3e-5, 1e-3, 1e-3


@pytest.fixture(scope="module")
def vocoder(tmp_path_factory) -> Token2WavVocoder:
    return Token2WavVocoder(make_token2wav_assets(tmp_path_factory.mktemp("token2wav"), seed=1234), n_timesteps=5)


@pytest.fixture(scope="module")
def model(vocoder) -> Token2WavModel:
    return vocoder.model


@pytest.fixture(scope="module")
def prompts() -> dict[str, PromptFeatures]:
    """Voices: the reference's prompts a (50 tokens) and b (80 tokens), and each with other speaker embeddings."""
    ref = np.load(REFERENCE)

    def prompt(name: str, spk_seed: int | None = None) -> PromptFeatures:
        spk = torch.from_numpy(ref[f"{name}/spk"])
        if spk_seed is not None:
            spk = torch.randn(1, 192, generator=torch.Generator().manual_seed(spk_seed))
        return PromptFeatures(
            torch.from_numpy(ref[f"{name}/prompt_tokens"]).long(), spk, torch.from_numpy(ref[f"{name}/prompt_mel"])
        )

    b = prompt("b", 4)
    # 75 tokens: its caches line up with a's one chunk later, but are trimmed at another length.
    c = PromptFeatures(b.tokens[:, :75], b.spk, b.mel[:, :150])
    return {
        "a0": prompt("a"),
        "a1": prompt("a", 1),
        "a2": prompt("a", 2),
        "b0": prompt("b"),
        "b1": prompt("b", 3),
        "c0": c,
    }


def _rounds(seed: int = 0) -> list[dict[str, tuple[list[int], bool]]]:
    """Each round: the streams that take a chunk, with its tokens and ``last``. Streams start at different rounds
    (first chunks beside later ones, caches of different lengths), last chunks sit beside non-last ones, and
    a1 and b1 end before the others go on past the caches' trim."""
    rng = np.random.default_rng(seed)

    def chunk(n: int = 28, last: bool = False) -> tuple[list[int], bool]:
        return rng.integers(0, 6561, n).tolist(), last

    return [
        {"a0": chunk(), "a1": chunk(), "b0": chunk()},
        {"a0": chunk(), "a1": chunk(), "a2": chunk(), "b0": chunk(), "b1": chunk(), "c0": chunk()},
        {"a0": chunk(), "a1": chunk(), "a2": chunk(), "b0": chunk(10, True), "b1": chunk(), "c0": chunk()},
        {"a0": chunk(), "a1": chunk(28, True), "a2": chunk(), "b1": chunk(12, True), "c0": chunk()},
        {"a0": chunk(), "a2": chunk(), "c0": chunk()},
        {"a0": chunk(), "a2": chunk()},
        {"a0": chunk(5, True), "a2": chunk(5, True)},
    ]


def _run(model, prompts, rounds, *, batched: bool):
    streams = {name: model.start(p) for name, p in prompts.items()}
    outputs = []
    for plan in rounds:
        names = list(plan)
        if batched:
            got = model.chunk_many(
                [streams[n] for n in names], [plan[n][0] for n in names], [plan[n][1] for n in names]
            )
        else:
            got = [model.chunk(streams[n], plan[n][0], last=plan[n][1]) for n in names]
        outputs.append(dict(zip(names, got, strict=True)))
    return outputs, streams


def _state(stream: Token2WavStream) -> list[torch.Tensor]:
    f = stream.flow
    return [f.conformer_cnn, f.conformer_att, f.estimator_cnn, f.estimator_att, *_tails(stream)]


def _tails(stream: Token2WavStream) -> list[torch.Tensor]:
    return [stream.mel_tail, stream.source_tail, stream.speech_tail]


@pytest.fixture
def batches(monkeypatch) -> list[list[Token2WavStream]]:
    """The streams of every batch the model runs during the test, in order."""
    seen: list[list[Token2WavStream]] = []
    original = Token2WavModel._chunk_batch

    def spy(self, streams, token_lists, last):
        seen.append(list(streams))
        return original(self, streams, token_lists, last)

    monkeypatch.setattr(Token2WavModel, "_chunk_batch", spy)
    return seen


def test_batched_chunks_equal_chunks_stream_by_stream(model, prompts, batches):
    rounds = _rounds()
    want, alone = _run(model, prompts, rounds, batched=False)
    batches.clear()
    got, together = _run(model, prompts, rounds, batched=True)
    names = {id(stream): name for name, stream in together.items()}
    # Round by round: first chunks of a0 a1 | a0 a1 later, a2 b1 c0 first | a0 a1 c0 (c0's caches as long as
    # theirs, its prompt longer: trimmed apart), b0 last | a0 a2, a1 last (as long, as far), b1 last | a0 a2
    # caches trimmed, c0 not yet.
    assert [" ".join(names[id(s)] for s in batch) for batch in batches] == [
        *("a0 a1", "b0"),
        *("a0 a1", "a2", "b0", "b1", "c0"),
        *("a0 a1 c0", "a2", "b0", "b1"),
        *("a0 a2", "a1", "b1", "c0"),
        *("a0 a2", "c0"),
        *("a0 a2",),
        *("a0 a2",),
    ]
    worst = {"audio": 0.0, "mel": 0.0, "state": 0.0}
    for k, (w_round, g_round) in enumerate(zip(want, got, strict=True)):
        for name, (w_audio, w_mel) in w_round.items():
            g_audio, g_mel = g_round[name]
            assert g_audio.shape == w_audio.shape and g_mel.shape == w_mel.shape, (k, name)
            worst["audio"] = max(worst["audio"], float(np.abs(g_audio - w_audio).max()))
            worst["mel"] = max(worst["mel"], float((g_mel - w_mel).abs().max()))
            np.testing.assert_allclose(g_audio, w_audio, rtol=0, atol=AUDIO_ATOL, err_msg=f"round {k} {name}")
            np.testing.assert_allclose(g_mel.numpy(), w_mel.numpy(), rtol=0, atol=MEL_ATOL, err_msg=f"round {k}")
    for name in prompts:
        assert together[name].calls == alone[name].calls
        for g, w in zip(_state(together[name]), _state(alone[name]), strict=True):
            assert g.shape == w.shape, name
            worst["state"] = max(worst["state"], float((g - w).abs().max()))
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=0, atol=STATE_ATOL, err_msg=name)
    print("batched vs per stream, max abs diff:", worst)
    # The states carry on: a next chunk per stream gives what it gives after the per-stream run.
    tokens = np.random.default_rng(7).integers(0, 6561, 28).tolist()
    for name in prompts:
        g_audio, _ = model.chunk(together[name], tokens, last=False)
        w_audio, _ = model.chunk(alone[name], tokens, last=False)
        np.testing.assert_allclose(g_audio, w_audio, rtol=0, atol=AUDIO_ATOL, err_msg=name)


def test_a_batch_out_of_device_memory_runs_again_halved_from_the_streams_as_they_were(model, prompts, monkeypatch):
    """The device runs out of memory in a batch of more than two streams, after its flow has advanced their caches
    and its HiFT call has taken their noise: the streams are put back, the batch runs in halves, and the model
    keeps the smaller size. Every output and state is what the per-stream run gives."""
    rounds = _rounds()
    want, alone = _run(model, prompts, rounds, batched=False)
    hift = Token2WavModel._hift_generator
    failed: list[int] = []

    def tight_memory(self, stream):
        gen = hift(self, stream)  # the stream's call count is taken before the allocation fails
        if len(self._batch_now) > 2:
            failed.append(len(self._batch_now))
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return gen

    original = Token2WavModel._chunk_batch

    def note_batch(self, streams, token_lists, last):
        self._batch_now = list(streams)
        return original(self, streams, token_lists, last)

    monkeypatch.setattr(Token2WavModel, "_hift_generator", tight_memory)
    monkeypatch.setattr(Token2WavModel, "_chunk_batch", note_batch)
    monkeypatch.setattr(model, "max_batch", 8)
    monkeypatch.setattr(model, "_batch_now", [], raising=False)
    got, together = _run(model, prompts, rounds, batched=True)
    assert failed == [3] and model.max_batch == 1  # a0 a1 c0 failed at 3; then 3 // 2 = 1 stream a batch
    for w_round, g_round in zip(want, got, strict=True):
        for name, (w_audio, _) in w_round.items():
            np.testing.assert_allclose(g_round[name][0], w_audio, rtol=0, atol=AUDIO_ATOL, err_msg=name)
    for name in prompts:
        assert together[name].calls == alone[name].calls, name
        for g, w in zip(_state(together[name]), _state(alone[name]), strict=True):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=0, atol=STATE_ATOL, err_msg=name)


def test_one_stream_out_of_device_memory_is_the_engines_failure(model, prompts, monkeypatch):
    def no_memory(self, stream):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(Token2WavModel, "_hift_generator", no_memory)
    stream = model.start(prompts["a0"])
    flow = stream.flow
    with pytest.raises(torch.OutOfMemoryError):
        model.chunk_many([stream], [[1] * 28], [False])
    assert stream.flow is flow and stream.calls == 0 and stream.mel_tail.shape[-1] == 0  # left as it was


def test_a_batch_of_one_is_the_per_stream_chunk_exactly(model, prompts):
    """``chunk`` is ``chunk_many`` of one: a stream alone in a call, or alone in its group, runs the very same ops."""
    tokens = np.random.default_rng(3).integers(0, 6561, 28).tolist()
    a, b, c = (model.start(prompts[n]) for n in ("a0", "b0", "b0"))
    model.chunk(c, tokens, last=False)  # c is a chunk ahead of b: b is alone in its group
    got = model.chunk_many([a, b, c], [tokens] * 3, [False] * 3)
    want = [model.chunk(model.start(prompts[n]), tokens, last=False) for n in ("a0", "b0")]
    for (g_audio, g_mel), (w_audio, w_mel) in zip(got[:2], want, strict=True):
        np.testing.assert_array_equal(g_audio, w_audio)
        assert torch.equal(g_mel, w_mel)


def test_flow_caches_batch_with_every_sessions_cond_rows_first(model, prompts):
    caches = [model.start(prompts[n]).flow for n in ("a0", "a1", "a2")]
    batch = FlowCache.batch(caches)
    assert batch.estimator_att.shape[2] == 6 and batch.conformer_att.shape[1] == 3
    for i, c in enumerate(caches):
        assert torch.equal(batch.estimator_att[:, :, i], c.estimator_att[:, :, 0])  # cond
        assert torch.equal(batch.estimator_att[:, :, 3 + i], c.estimator_att[:, :, 1])  # uncond
        assert torch.equal(batch.estimator_cnn[:, :, 3 + i], c.estimator_cnn[:, :, 1])
        assert torch.equal(batch.conformer_cnn[i], c.conformer_cnn[0])
    for back, c in zip(batch.unbatch(3), caches, strict=True):
        assert back.shapes() == c.shapes()
        for x, y in zip(_state_of(back), _state_of(c), strict=True):
            assert torch.equal(x, y)
            assert x.untyped_storage().nbytes() == y.numel() * y.element_size(), "a copy, not a view of the batch"


def _state_of(cache: FlowCache) -> list[torch.Tensor]:
    return [cache.conformer_cnn, cache.conformer_att, cache.estimator_cnn, cache.estimator_att]


def test_hift_rows_draw_from_their_own_generators(model):
    """HiFT's noise per row comes from the row's generator: a batch gives each row what it gets alone."""
    gen = torch.Generator().manual_seed(5)
    mel = torch.randn(3, 80, 20, generator=gen)
    cache = torch.randn(3, 1, 3840, generator=gen) * 0.1
    seeds = (11, 12, 13)
    speech, source = model.hift(mel, cache, [torch.Generator().manual_seed(s) for s in seeds])
    for i, seed in enumerate(seeds):
        alone, alone_source = model.hift(mel[i : i + 1], cache[i : i + 1], [torch.Generator().manual_seed(seed)])
        np.testing.assert_allclose(speech[i : i + 1].numpy(), alone.numpy(), rtol=0, atol=AUDIO_ATOL)
        np.testing.assert_allclose(source[i : i + 1].numpy(), alone_source.numpy(), rtol=0, atol=AUDIO_ATOL)
    other, _ = model.hift(mel[:1], cache[:1], [torch.Generator().manual_seed(99)])
    assert float((other - speech[:1]).abs().max()) > 100 * AUDIO_ATOL, "the seed must matter, or this tests nothing"
    with pytest.raises(ValueError, match="2 generators for a batch of 3"):
        model.hift(mel, cache, [gen, gen])


def test_a_stream_twice_in_one_call_is_refused(model, prompts):
    s = model.start(prompts["a0"])
    with pytest.raises(ValueError, match="one chunk per call"):
        model.chunk_many([s, s], [[1] * 28, [2] * 28], [False, False])


# Units of four sessions, one dict per tick: session -> (codes, end of turn). A unit of 30 codes takes two chunks,
# a turn's end a last chunk after its others; session 3 has an empty unit, and sessions end and restart turns.
UNITS = [
    {0: (25, False), 1: (25, False), 2: (25, False), 3: (25, False)},
    {0: (25, False), 1: (30, False), 2: (10, True), 3: (0, False)},
    {0: (25, False), 1: (25, False), 2: (25, False), 3: (25, True)},
    {0: (25, False), 1: (25, False), 2: (25, False), 3: (25, False)},
    {0: (20, True), 1: (25, False), 2: (25, False)},
    {0: (25, False), 1: (3, True), 2: (25, False), 3: (25, False)},
    {0: (25, False), 2: (25, False), 3: (25, False)},
]


def _sessions(vocoder: Token2WavVocoder) -> list:
    """Two sessions on the built-in voice, then the reference's prompt clips a (as long) and b (longer)."""
    ref = np.load(REFERENCE)
    return [vocoder.new_state(clip) for clip in (None, None, ref["a/prompt_audio"], ref["b/prompt_audio"])]


def test_synthesize_many_equals_synthesize_session_by_session(vocoder, batches):
    rng = np.random.default_rng(1)
    units = [{k: (rng.integers(0, 6561, n).tolist(), eot) for k, (n, eot) in unit.items()} for unit in UNITS]
    alone, together = _sessions(vocoder), _sessions(vocoder)
    worst, batched = 0.0, []
    for u, unit in enumerate(units):
        keys = list(unit)
        batches.clear()
        got = vocoder.synthesize_many(
            [together[k] for k in keys], [unit[k][0] for k in keys], [unit[k][1] for k in keys]
        )
        batched.append([len(b) for b in batches])
        for k, g in zip(keys, got, strict=True):
            w = vocoder.synthesize(alone[k], unit[k][0], end_of_turn=unit[k][1])
            assert g.shape == w.shape and g.dtype == np.float32, (u, k)
            worst = max(worst, float(np.abs(g - w).max()) if w.size else 0.0)
            np.testing.assert_allclose(g, w, rtol=0, atol=AUDIO_ATOL, err_msg=f"unit {u} session {k}")
            assert together[k].buffer == alone[k].buffer
    print("synthesize_many vs synthesize, max abs diff:", worst)
    # Per unit, round by round: {0 1 2: first chunks of three 2 s voices} {3} | {0 1} {2: 13 codes} then
    # {1: second chunk} {2: last} | {0 1} {2: new turn} {3} then {3: last} | {0 1} {2} {3: new turn} | {0: 23 codes}
    # {1 2: both caches trimmed} then {0: last} | {0: new turn} {1: last} {2} {3} | three cache lengths.
    assert batched == [[3, 1], [2, 1, 1, 1], [2, 1, 1, 1], [2, 1, 1], [1, 2, 1], [1, 1, 1, 1], [1, 1, 1]], batched
    for k in range(4):  # the streams carry on alike
        codes = rng.integers(0, 6561, 25).tolist()
        g = vocoder.synthesize(together[k], codes, end_of_turn=False)
        np.testing.assert_allclose(g, vocoder.synthesize(alone[k], codes, end_of_turn=False), rtol=0, atol=AUDIO_ATOL)


def test_silent_vocoder_synthesizes_many_silences():
    voc = SilentVocoder()
    states = [voc.new_state(None) for _ in range(3)]
    out = voc.synthesize_many(states, [[1] * 25, [], [2] * 10], [False, True, False])
    assert [a.shape for a in out] == [(24000,), (0,), (9600,)] and not any(a.any() for a in out)
