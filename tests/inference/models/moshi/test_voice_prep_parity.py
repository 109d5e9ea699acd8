"""Voice wavs at other rates than 24 kHz (a user's 16, 44.1 or 48 kHz upload), mono and stereo: our prepared voice
prompt (sphn read + resample, pyloudnorm -24 LUFS) gives exactly the Mimi codes the PersonaPlex reference gives for
the same file.

``make test`` compares against the reference's codes stored in ``tests/data/personaplex/voice_rates/`` (how they were
made is written beside them); ``make test-reference`` also runs the reference live on the same files.

The reference refuses a stereo voice wav (its loudness step hands pyloudnorm [C, T] and gets "five channels or
less"), and encodes only the first channel of what it loaded; so a stereo file's codes are compared with the
reference's codes of a mono file holding the same first channel at the same rate.
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile

from inference.models.moshi.config import read_checkpoint_dir
from tests.inference.models.moshi.moshi_lm_helpers import PERSONAPLEX_DATA
from tests.inference.models.moshi.personaplex_packs import encode_voice, require_reference, run_reference_job

RATES = (16000, 44100, 48000)
VOICE_RATES = PERSONAPLEX_DATA / "voice_rates"
STORED_CODES = VOICE_RATES / "reference_codes.npz"


def write_voice_wavs(tmp_path) -> list[tuple[str, object, object]]:
    """(name, our input wav, the reference's input wav) for every rate, mono and stereo. The mono files are the
    stored 16-bit PCM inputs; each stereo file holds one as its first channel and a quieter, delayed copy as its
    second, so taking the wrong channel or downmixing changes the codes."""
    cases = []
    for rate in RATES:
        mono_wav = VOICE_RATES / f"mono{rate}.wav"
        mono, stored_rate = soundfile.read(str(mono_wav), dtype="int16")
        assert stored_rate == rate
        other = (0.3 * np.roll(mono, rate // 50)).astype(np.int16)
        stereo_wav = tmp_path / f"stereo{rate}.wav"
        soundfile.write(stereo_wav, np.stack([mono, other], axis=1), rate, subtype="PCM_16")
        cases.append((f"mono{rate}", mono_wav, mono_wav))
        cases.append((f"stereo{rate}", stereo_wav, mono_wav))
    return cases


def assert_codes_equal(ours, theirs, name: str) -> None:
    assert ours.shape == theirs.shape, f"{name}: {ours.shape} frames vs the reference's {theirs.shape}"
    np.testing.assert_array_equal(ours, theirs, err_msg=name)


def test_voice_wavs_at_other_rates_give_the_stored_reference_codes(tmp_path):
    stored = np.load(STORED_CODES)
    info = read_checkpoint_dir(PERSONAPLEX_DATA / "ckpt")
    for name, ours_wav, ref_wav in write_voice_wavs(tmp_path):
        assert_codes_equal(encode_voice(info, ours_wav), stored[ref_wav.stem], name)
    # The rates really differ: a 16 kHz file is not the 48 kHz one's codes (the check above can fail).
    assert not np.array_equal(stored["mono16000"], stored["mono48000"])


@pytest.mark.personaplex_reference
def test_voice_wavs_at_other_rates_give_the_live_reference_codes(tmp_path):
    """The live reference gives the stored codes, and ours equal them (``make test-reference``)."""
    require_reference()
    ckpt = PERSONAPLEX_DATA / "ckpt"
    cases = write_voice_wavs(tmp_path)
    jobs = [{"voice": str(ref_wav), "out": str(tmp_path / f"ref-{name}.npy")} for name, _, ref_wav in cases]
    run_reference_job(ckpt, [], tmp_path, voice_codes=jobs)
    info = read_checkpoint_dir(ckpt)
    stored = np.load(STORED_CODES)
    for (name, ours_wav, ref_wav), job in zip(cases, jobs, strict=True):
        theirs = np.load(job["out"])
        np.testing.assert_array_equal(theirs, stored[ref_wav.stem], err_msg=f"{name}: live reference vs stored")
        assert_codes_equal(encode_voice(info, ours_wav), theirs, name)
