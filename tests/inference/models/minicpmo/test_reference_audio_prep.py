"""MiniCPM-o reference voices at 16, 44.1 and 48 kHz, mono and stereo: ``load_reference_audio`` (soundfile, mean
of the channels, soxr HQ) against the MiniCPM-o reference's own loader, ``librosa.load(path, sr=16000)``, run
live in ``.venv-minicpmo-ref`` (librosa 0.11.0, soxr 1.1.0). Both waveforms then go through our reference-voice
embedding (the one ``test_golden.py`` checks against the reference's stored intermediates), compared within
STAGE_ATOL, the measured float spread of that stage.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr

from inference.engines.unit import load_reference_audio
from tests.ci_skips import skips_are_failures
from tests.inference.models.minicpmo.test_golden import STAGE_ATOL

pytestmark = pytest.mark.reference
ROOT = Path(__file__).resolve().parents[4]
REF_PYTHON = ROOT / ".venv-minicpmo-ref" / "bin" / "python"
RATES = (16000, 44100, 48000)
LIBROSA_LOAD = """
import json, sys
import librosa, numpy as np
for wav, out in json.loads(sys.argv[1]):
    y, _ = librosa.load(wav, sr=16000)
    np.save(out, y)
"""


def test_reference_voices_at_other_rates_load_and_embed_as_the_reference(minicpmo_parts, minicpmo_data_dir, tmp_path):
    if not REF_PYTHON.exists():
        hint = " (CI: scripts/install-python.sh test builds it)" if skips_are_failures() else ""
        pytest.skip(f".venv-minicpmo-ref is not installed{hint}")
    speech = np.load(minicpmo_data_dir / "omni6" / "ref_audio.npy").astype(np.float32)  # 16 kHz speech
    pairs = []
    for rate in RATES:
        mono = soxr.resample(speech, 16000, rate).astype(np.float32)
        other = 0.3 * np.roll(mono, rate // 50)  # a different second channel: the downmix must average both
        for name, audio in (("mono", mono), ("stereo", np.stack([mono, other], axis=1))):
            wav = tmp_path / f"{name}{rate}.wav"
            soundfile.write(wav, audio, rate, subtype="PCM_16")
            pairs.append((str(wav), str(tmp_path / f"{name}{rate}.librosa.npy")))
    done = subprocess.run(
        [str(REF_PYTHON), "-c", LIBROSA_LOAD, json.dumps(pairs)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    embeddings = []
    for wav, out in pairs:
        theirs = np.load(out)
        ours = load_reference_audio(Path(wav))
        assert ours.dtype == np.float32 and ours.shape == theirs.shape, (wav, ours.shape, theirs.shape)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6, err_msg=wav)
        ours_emb = minicpmo_parts.audio.embed_reference(ours).numpy()
        theirs_emb = minicpmo_parts.audio.embed_reference(theirs).numpy()
        np.testing.assert_allclose(ours_emb, theirs_emb, rtol=0, atol=STAGE_ATOL, err_msg=wav)
        embeddings.append(ours_emb)
    # The stereo files' second channel counts: their embeddings are not the mono ones'.
    assert np.abs(embeddings[0] - embeddings[1]).max() > STAGE_ATOL
