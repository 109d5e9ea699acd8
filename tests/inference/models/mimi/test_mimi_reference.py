"""Parity with the reference Mimi (moshi 0.2.13, run in `.venv-moshi-ref`) on two tiny Mimis.

The golden pack's tiny Mimi and a second random one from `random_mimi_state_dict` (which also proves that stock
moshi loads our Kyutai-layout state dicts strictly). Inputs: real speech (the golden voice prompt) and a chirp
with noise, 28 frames each, batched; decoding uses random codes over 24 frames.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from inference.models.moshi.mimi import MimiCodec
from inference.models.moshi.mimi_config import MimiConfig

REPO = Path(__file__).resolve().parents[4]
DATA = REPO / "tests" / "data" / "personaplex"

pytestmark = pytest.mark.reference

FRAME = 1920


def stream_encode(codec, pcm: torch.Tensor) -> torch.Tensor:
    state = codec.init_stream(pcm.shape[0])
    steps = [codec.encode_step(pcm[..., i : i + FRAME], state) for i in range(0, pcm.shape[-1], FRAME)]
    return torch.cat(steps, dim=-1)


def stream_decode(codec, codes: torch.Tensor) -> torch.Tensor:
    state = codec.init_stream(codes.shape[0])
    return torch.cat([codec.decode_step(codes[..., t : t + 1], state) for t in range(codes.shape[-1])], dim=-1)


@pytest.fixture(params=["golden", "random"])
def codec_and_reference(request):
    if request.param == "golden":
        return request.getfixturevalue("golden_codec"), request.getfixturevalue("golden_reference")
    return request.getfixturevalue("random_codec"), request.getfixturevalue("random_reference")


def test_streaming_encode_gives_the_reference_codes(codec_and_reference, test_audio):
    codec, ref = codec_and_reference
    codes = stream_encode(codec, test_audio)
    assert codes.dtype == torch.int64 and codes.shape == (2, 8, 28)
    assert torch.equal(codes, ref["codes_stream"])


def test_whole_clip_encode_gives_the_reference_codes(codec_and_reference, test_audio):
    codec, ref = codec_and_reference
    assert torch.equal(codec.encode(test_audio), ref["codes_whole"])


def test_the_codes_are_not_degenerate(codec_and_reference, test_audio):
    # Guards the parity checks above against a trivially constant encoder. (The golden random Mimi's semantic
    # codebook does collapse to one code; the acoustic ones vary frame to frame.)
    _, ref = codec_and_reference
    codes = ref["codes_stream"]
    for row in range(2):
        assert len(torch.unique(codes[row, 1:])) > 40
        assert sum(len(torch.unique(codes[row, k])) > 5 for k in range(8)) >= 4
    assert not torch.equal(codes[0], codes[1])


def test_decode_matches_the_reference(codec_and_reference, random_codes):
    codec, ref = codec_and_reference
    pcm = codec.decode(random_codes)
    assert pcm.shape == (2, 1, 24 * FRAME)
    assert ref["pcm_whole"].abs().max() > 1e-2  # a real signal, so a 1e-4 tolerance means something
    torch.testing.assert_close(pcm, ref["pcm_whole"], rtol=0, atol=1e-4)


def test_streaming_decode_matches_the_reference(codec_and_reference, random_codes):
    codec, ref = codec_and_reference
    torch.testing.assert_close(stream_decode(codec, random_codes), ref["pcm_stream"], rtol=0, atol=1e-4)


def test_full_size_codec_has_the_published_key_layout(tmp_path):
    """Our full-size (published) Mimi has exactly moshi's state-dict keys and shapes, so the published
    Kyutai checkpoint, which moshi loads strictly, loads into ours strictly too."""
    ref_python = REPO / ".venv-moshi-ref" / "bin" / "python"
    if not ref_python.exists():
        pytest.skip("reference venv .venv-moshi-ref is missing")
    out = tmp_path / "keys.json"
    env = {**os.environ, "NO_TORCH_COMPILE": "1", "OMP_NUM_THREADS": "1"}
    runner = Path(__file__).with_name("mimi_ref_runner.py")
    result = subprocess.run([str(ref_python), str(runner), "--describe-default", "--out", str(out)],
                            env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    # moshi keeps per-step `in_projs.0` / `out_projs.0` internally; the published file stores them fused as
    # `in_proj_weight` / `out_proj.weight` and moshi's load hook splits them (reference doc section 5).
    reference = {
        k.replace("self_attn.in_projs.0.weight", "self_attn.in_proj_weight").replace(
            "self_attn.out_projs.0.weight", "self_attn.out_proj.weight"
        ): v
        for k, v in json.loads(out.read_text()).items()
    }
    with torch.device("meta"):
        ours = {k: list(v.shape) for k, v in MimiCodec(MimiConfig.kyutai_default()).state_dict().items()}
    assert ours == reference
    assert len(ours) > 300


def test_long_stream_past_the_attention_window_matches_the_reference(
    golden_codec, tiny_config, tmp_path, reference, chirp
):
    """140 frames = 280 transformer steps > context 250: the KV ring wraps, and we keep moshi's window."""
    frames = 140
    pcm = torch.from_numpy(chirp(frames * FRAME, seed=11))[None, None]
    codes = torch.randint(0, 2048, (1, 8, frames), generator=torch.Generator().manual_seed(1))
    ref = reference(DATA / "ckpt" / "mimi.safetensors", tiny_config, pcm, codes, tmp_path)
    assert torch.equal(stream_encode(golden_codec, pcm), ref["codes_stream"])
    torch.testing.assert_close(stream_decode(golden_codec, codes), ref["pcm_stream"], rtol=0, atol=1e-4)
    assert ref["pcm_stream"].abs().max() > 1e-2
