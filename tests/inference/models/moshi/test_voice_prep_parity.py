"""Voice wavs at other rates than 24 kHz (a user's 16, 44.1 or 48 kHz upload), mono and stereo: our prepared voice
prompt (sphn read + resample, pyloudnorm -24 LUFS) gives exactly the Mimi codes the live PersonaPlex reference
gives for the same file.

The reference refuses a stereo voice wav (its loudness step hands pyloudnorm [C, T] and gets "five channels or
less"), and encodes only the first channel of what it loaded; so a stereo file's codes are compared with the
reference's codes of a mono file holding the same first channel at the same rate.
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile
import soxr

from inference.models.moshi.config import read_checkpoint_dir
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA
from tests.inference.models.moshi.personaplex_packs import (
    VOICE_WAV,
    encode_voice,
    require_reference,
    run_reference_job,
)

pytestmark = pytest.mark.reference
RATES = (16000, 44100, 48000)


def write_voice_wavs(tmp_path) -> list[tuple[str, object, object]]:
    """(name, our input wav, the reference's input wav) for every rate, mono and stereo (16-bit PCM, as uploads
    usually are). The stereo files' second channel is a quieter, delayed copy, so taking the wrong channel or
    downmixing changes the codes."""
    speech, rate = soundfile.read(str(VOICE_WAV), dtype="float32")  # 24 kHz speech, about 1 s
    cases = []
    for dst in RATES:
        mono = soxr.resample(speech, rate, dst).astype(np.float32)
        other = 0.3 * np.roll(mono, dst // 50)
        soundfile.write(tmp_path / f"mono{dst}.wav", mono, dst, subtype="PCM_16")
        soundfile.write(tmp_path / f"stereo{dst}.wav", np.stack([mono, other], axis=1), dst, subtype="PCM_16")
        cases.append((f"mono{dst}", tmp_path / f"mono{dst}.wav", tmp_path / f"mono{dst}.wav"))
        cases.append((f"stereo{dst}", tmp_path / f"stereo{dst}.wav", tmp_path / f"mono{dst}.wav"))
    return cases


def test_voice_wavs_at_other_rates_give_the_reference_codes(tmp_path):
    require_reference()
    ckpt = PERSONAPLEX_DATA / "ckpt"
    cases = write_voice_wavs(tmp_path)
    jobs = [{"voice": str(ref_wav), "out": str(tmp_path / f"ref-{name}.npy")} for name, _, ref_wav in cases]
    run_reference_job(ckpt, [], tmp_path, voice_codes=jobs)
    info = read_checkpoint_dir(ckpt)
    for (name, ours_wav, _), job in zip(cases, jobs, strict=True):
        theirs = np.load(job["out"])
        ours = encode_voice(info, ours_wav)
        assert ours.shape == theirs.shape, f"{name}: {ours.shape} frames vs the reference's {theirs.shape}"
        np.testing.assert_array_equal(ours, theirs, err_msg=name)
    # The rates really differ: a 16 kHz file is not the 48 kHz one's codes (the check above can fail).
    assert not np.array_equal(np.load(jobs[0]["out"]), np.load(jobs[-1]["out"]))
