"""Our codec's streaming behaviour: frame-by-frame equals whole clip, per-slot reset, independent batch rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.models.moshi.mimi import MimiCodec
from inference.models.moshi.mimi_config import MimiConfigError
from inference.models.moshi.mimi_loading import load_mimi

FRAME = 1920
DATA = Path(__file__).resolve().parents[4] / "tests" / "data" / "personaplex"


def stream_encode(codec: MimiCodec, pcm: torch.Tensor, state=None) -> torch.Tensor:
    state = state if state is not None else codec.init_stream(pcm.shape[0])
    steps = [codec.encode_step(pcm[..., i : i + FRAME], state) for i in range(0, pcm.shape[-1], FRAME)]
    return torch.cat(steps, dim=-1)


def stream_decode(codec: MimiCodec, codes: torch.Tensor, state=None) -> torch.Tensor:
    state = state if state is not None else codec.init_stream(codes.shape[0])
    return torch.cat([codec.decode_step(codes[..., t : t + 1], state) for t in range(codes.shape[-1])], dim=-1)


@pytest.fixture(params=["golden", "random"])
def codec(request) -> MimiCodec:
    return request.getfixturevalue(f"{request.param}_codec")


def test_codec_constants(golden_codec):
    assert golden_codec.frame_size == 1920
    assert golden_codec.sample_rate == 24000
    assert golden_codec.frame_rate == 12.5
    assert golden_codec.num_codebooks == 8


def test_streaming_encode_equals_whole_clip_encode(codec, test_audio):
    assert torch.equal(stream_encode(codec, test_audio), codec.encode(test_audio))


def test_whole_clip_encode_pads_a_partial_last_frame(codec, test_audio):
    clip = test_audio[..., : 10 * FRAME + 700]
    padded = torch.nn.functional.pad(clip, (0, FRAME - 700))
    codes = codec.encode(clip)
    assert codes.shape == (2, 8, 11)
    assert torch.equal(codes, codec.encode(padded))


def test_streaming_decode_equals_whole_clip_decode_on_real_audio(codec, test_audio):
    codes = codec.encode(test_audio)  # [2, 8, 28]: speech and chirp + noise
    whole = codec.decode(codes)
    streamed = stream_decode(codec, codes)
    assert whole.shape == streamed.shape == (2, 1, 28 * FRAME)
    assert whole.abs().max() > 1e-2
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-4)


def test_decoding_frames_without_carried_state_would_differ(codec, test_audio):
    # The check above can fail: dropping the conv/KV state between frames (as transformers 5.x does for the
    # SEANet decoder) gives clearly different audio.
    codes = codec.encode(test_audio)
    whole = codec.decode(codes)
    stateless = torch.cat([codec.decode(codes[..., t : t + 1]) for t in range(codes.shape[-1])], dim=-1)
    assert (stateless - whole).abs().max() > 1e-3


def test_batch_rows_are_independent(codec, test_audio):
    codes = stream_encode(codec, test_audio)
    for row in range(2):
        alone = stream_encode(codec, test_audio[row : row + 1])
        assert torch.equal(alone[0], codes[row])
    pcm = stream_decode(codec, codes)
    for row in range(2):
        torch.testing.assert_close(stream_decode(codec, codes[row : row + 1])[0], pcm[row], rtol=0, atol=1e-5)


def test_reset_restarts_only_the_masked_rows(codec, test_audio):
    first, second = test_audio[..., : 12 * FRAME], test_audio[..., 12 * FRAME : 20 * FRAME]
    state = codec.init_stream(2)
    stream_encode(codec, first, state)
    codes_before = codec.encode(test_audio[..., : 12 * FRAME])
    stream_decode(codec, codes_before, state)

    state.reset(torch.tensor([True, False]))
    codes = stream_encode(codec, second, state)
    uninterrupted = stream_encode(codec, test_audio[..., : 20 * FRAME])[..., 12:]
    fresh = stream_encode(codec, second)
    assert torch.equal(codes[1], uninterrupted[1])  # row 1 carried on as if nothing happened
    assert torch.equal(codes[0], fresh[0])  # row 0 started over
    assert not torch.equal(codes[0], uninterrupted[0])  # and that differs from carrying on

    later_codes = codec.encode(test_audio[..., 12 * FRAME : 20 * FRAME])
    pcm = stream_decode(codec, later_codes, state)
    all_codes = torch.cat([codes_before, later_codes], dim=-1)
    torch.testing.assert_close(pcm[1], stream_decode(codec, all_codes)[1, :, 12 * FRAME :], rtol=0, atol=1e-5)
    torch.testing.assert_close(pcm[0], stream_decode(codec, later_codes)[0], rtol=0, atol=1e-5)


def test_reset_of_one_side_keeps_the_other(golden_codec, test_audio):
    codec = golden_codec
    state = codec.init_stream(2)
    stream_encode(codec, test_audio[..., : 5 * FRAME], state)
    state.reset(torch.tensor([True, True]), encoder=False)
    codes = stream_encode(codec, test_audio[..., 5 * FRAME : 8 * FRAME], state)
    assert torch.equal(codes, stream_encode(codec, test_audio[..., : 8 * FRAME])[..., 5:])


def test_fewer_codebooks_give_the_leading_codes(golden_codec, test_audio, tiny_config):
    codec4 = load_mimi(DATA / "ckpt" / "mimi.safetensors", tiny_config, num_codebooks=4)
    assert codec4.num_codebooks == 4
    codes4 = stream_encode(codec4, test_audio)
    assert torch.equal(codes4, golden_codec.encode(test_audio)[:, :4])
    pcm = stream_decode(codec4, codes4)
    torch.testing.assert_close(pcm, codec4.decode(codes4), rtol=0, atol=1e-4)
    all16 = load_mimi(DATA / "ckpt" / "mimi.safetensors", tiny_config, num_codebooks=16).encode(test_audio)
    assert all16.shape == (2, 16, 28) and torch.equal(all16[:, :8], golden_codec.encode(test_audio))


@pytest.mark.parametrize("bad", [0, 17, 2.0, True])
def test_invalid_codebook_counts_are_refused(tiny_config, bad):
    with pytest.raises(MimiConfigError, match="num_codebooks"):
        MimiCodec(tiny_config, num_codebooks=bad)
