"""Native Token2Wav on the GPU: the stored reference's mel within GPU float spread, audio non-silent, sessions
independent (measured on the H200: mel within 8.8e-6 of the CPU reference; tolerance 1e-3). HiFT's noise comes from a CUDA generator there, so its audio is not the CPU reference's
sample for sample; the mel (fixed noise drawn on the CPU) is compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from inference.models.minicpmo.token2wav.make_assets import make_token2wav_assets  # noqa: E402
from inference.models.minicpmo.token2wav.prompt import PromptEncoder  # noqa: E402
from inference.models.minicpmo.token2wav.stream import Token2WavModel  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "minicpmo45" / "token2wav" / "reference.npz"


@pytest.mark.parametrize("name", ["a", "b"])
def test_token2wav_on_cuda_matches_reference_mel(tmp_path, name):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref = np.load(REFERENCE)
    assets = make_token2wav_assets(tmp_path / "t2w", seed=1234)
    model = Token2WavModel.load(assets, device="cuda", n_timesteps=int(ref[f"{name}/n_timesteps"]))
    stream = model.start(PromptEncoder(assets).encode(ref[f"{name}/prompt_audio"]))
    for k in range(int(ref[f"{name}/chunks"])):
        tokens, last = ref[f"{name}/chunk{k}/tokens"].tolist(), bool(ref[f"{name}/chunk{k}/last"])
        wave, mel = model.chunk(stream, tokens, last=last)
        print(f"{name} chunk {k}: mel max abs diff {np.abs(mel.cpu().numpy() - ref[f'{name}/chunk{k}/mel']).max():.3g}")
        np.testing.assert_allclose(mel.cpu().numpy(), ref[f"{name}/chunk{k}/mel"], rtol=0, atol=1e-3)
        assert wave.shape == ref[f"{name}/chunk{k}/wave"][0].shape
        assert float(np.sqrt(np.mean(wave**2))) > 0.01
