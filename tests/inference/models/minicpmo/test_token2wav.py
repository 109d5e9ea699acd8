"""Native Token2Wav (flow + HiFT, streamed) against the reference's stored outputs, and bad-asset errors.

The reference outputs (``tests/data/minicpmo45/token2wav/reference.npz``, see its README) come from the
tiny random assets that ``make_assets`` writes with seed 1234; these tests write the same assets again and
feed the reference's prompt features (S3 tokens, CAM++ embedding, prompt mel) and chunks through ours.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from inference.models.minicpmo.token2wav.config import AssetError
from inference.models.minicpmo.token2wav.loading import (
    CAMPPLUS_ONNX,
    TOKENIZER_ONNX,
    check_onnx,
    load_flow,
    load_hift,
)
from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets
from inference.models.minicpmo.token2wav.stream import PromptFeatures, Token2WavModel

pytestmark = pytest.mark.usefixtures("single_torch_thread")  # tests/conftest.py

REFERENCE = Path(__file__).resolve().parents[3] / "data" / "minicpmo45" / "token2wav" / "reference.npz"
# Measured with tests/float_spread.py: bit-identical on the default CPU path here; under MKL_CBWR=COMPATIBLE +
# ATEN_CPU_CAPABILITY=default the mel moved by 5.3e-6 and the audio by 1.35e-4 (HiFT's exp/iSTFT amplify the
# mel's last bits). 1e-3 is ~7x the audio spread and far below a real bug (differences of order 1).
MEL_ATOL, WAVE_ATOL = 1e-3, 1e-3


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    return make_token2wav_assets(tmp_path_factory.mktemp("token2wav"), seed=1234)


@pytest.fixture(scope="module")
def reference():
    return np.load(REFERENCE)


def _prompt(ref, name: str) -> PromptFeatures:
    return PromptFeatures(
        tokens=torch.from_numpy(ref[f"{name}/prompt_tokens"]).long(),
        spk=torch.from_numpy(ref[f"{name}/spk"]),
        mel=torch.from_numpy(ref[f"{name}/prompt_mel"]),
    )


def _chunks(ref, name: str):
    for k in range(int(ref[f"{name}/chunks"])):
        yield k, ref[f"{name}/chunk{k}/tokens"].tolist(), bool(ref[f"{name}/chunk{k}/last"])


@pytest.mark.parametrize("name", ["a", "b"])
def test_streamed_mel_and_audio_match_reference(assets, reference, name):
    model = Token2WavModel.load(assets, n_timesteps=int(reference[f"{name}/n_timesteps"]))
    stream = model.start(_prompt(reference, name))
    for k, tokens, last in _chunks(reference, name):
        wave, mel = model.chunk(stream, tokens, last=last)
        np.testing.assert_allclose(mel.numpy(), reference[f"{name}/chunk{k}/mel"], rtol=0, atol=MEL_ATOL)
        np.testing.assert_allclose(wave, reference[f"{name}/chunk{k}/wave"][0], rtol=0, atol=WAVE_ATOL)
        assert float(np.sqrt(np.mean(wave**2))) > 0.01, "random assets give noise, not silence"


def test_sessions_do_not_share_state(assets, reference):
    """Two interleaved streams give what each gives alone (one model, per-session caches)."""
    model = Token2WavModel.load(assets, n_timesteps=5)
    alone = {}
    for name in ("a", "b"):
        s = model.start(_prompt(reference, name))
        alone[name] = [model.chunk(s, t, last=last)[0] for _, t, last in _chunks(reference, name)]
    streams = {name: model.start(_prompt(reference, name)) for name in ("a", "b")}
    plans = {name: list(_chunks(reference, name)) for name in ("a", "b")}
    for k in range(max(len(p) for p in plans.values())):
        for name in ("a", "b"):
            if k < len(plans[name]):
                _, t, last = plans[name][k]
                np.testing.assert_array_equal(model.chunk(streams[name], t, last=last)[0], alone[name][k])


def _copy(assets: Path, tmp_path: Path) -> Path:
    out = tmp_path / "assets"
    shutil.copytree(assets, out)
    return out


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def test_missing_file_is_named(assets, tmp_path):
    broken = _copy(assets, tmp_path)
    (broken / "hift.pt").unlink()
    with pytest.raises(AssetError, match="hift.pt"):
        Token2WavModel.load(broken)


def test_pickle_with_code_is_refused(assets, tmp_path):
    broken = _copy(assets, tmp_path)
    sd = torch.load(broken / "flow.pt", weights_only=True)
    torch.save({"x": _Evil(), **sd}, broken / "flow.pt")
    with pytest.raises(AssetError, match=r"flow\.pt.*refused"):
        load_flow(broken)


def test_wrong_shape_is_named(assets, tmp_path):
    broken = _copy(assets, tmp_path)
    sd = torch.load(broken / "hift.pt", weights_only=True)
    sd["m_source.l_linear.weight"] = torch.zeros(1, 5)
    torch.save(sd, broken / "hift.pt")
    with pytest.raises(AssetError, match=r"hift\.pt.*m_source\.l_linear\.weight"):
        load_hift(broken)


def test_flow_yaml_naming_other_classes_is_refused(assets, tmp_path):
    broken = _copy(assets, tmp_path)
    text = (broken / "flow.yaml").read_text().replace("cosyvoice2.flow.decoder_dit.DiT", "os.system")
    (broken / "flow.yaml").write_text(text)
    with pytest.raises(AssetError, match=r"flow\.yaml.*os\.system"):
        load_flow(broken)


def test_onnx_signatures(assets, tmp_path):
    check_onnx(assets / CAMPPLUS_ONNX)
    check_onnx(assets / TOKENIZER_ONNX)
    broken = _copy(assets, tmp_path)
    shutil.copy(broken / TOKENIZER_ONNX, broken / CAMPPLUS_ONNX)  # an ONNX model with other inputs
    with pytest.raises(AssetError, match="campplus.onnx"):
        check_onnx(broken / CAMPPLUS_ONNX)
    (broken / TOKENIZER_ONNX).write_bytes(b"not a model")
    with pytest.raises(AssetError, match=TOKENIZER_ONNX):
        check_onnx(broken / TOKENIZER_ONNX)


@pytest.mark.parametrize("name", ["a", "b"])
def test_prompt_path_matches_reference(assets, reference, name):
    """S3 tokens exactly; CAM++ embedding and prompt mel within float spread (measured 7e-7 / 5e-7 here)."""
    from inference.models.minicpmo.token2wav.prompt import PromptEncoder

    prompt = PromptEncoder(assets).encode(reference[f"{name}/prompt_audio"])
    np.testing.assert_array_equal(prompt.tokens.numpy(), reference[f"{name}/prompt_tokens"])
    np.testing.assert_allclose(prompt.spk.numpy(), reference[f"{name}/spk"], rtol=0, atol=1e-4)
    np.testing.assert_allclose(prompt.mel.numpy(), reference[f"{name}/prompt_mel"], rtol=0, atol=1e-4)


def test_clip_to_audio_end_to_end(assets, reference):
    """From the prompt clip itself (no stored features) to the reference's audio."""
    from inference.models.minicpmo.token2wav.prompt import PromptEncoder

    model = Token2WavModel.load(assets, n_timesteps=int(reference["a/n_timesteps"]))
    stream = model.start(PromptEncoder(assets).encode(reference["a/prompt_audio"]))
    for k, tokens, last in _chunks(reference, "a"):
        wave, _ = model.chunk(stream, tokens, last=last)
        np.testing.assert_allclose(wave, reference[f"a/chunk{k}/wave"][0], rtol=0, atol=WAVE_ATOL)
