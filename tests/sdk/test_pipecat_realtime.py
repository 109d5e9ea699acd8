"""pipecat's stock OpenAI Realtime service (pipecat-ai, pinned in scripts/install-python.sh) against Parley.

pipecat-ai pins other protobuf, soundfile and soxr versions than the app's, so it lives in its own venv,
``.venv-pipecat``, and the pipeline runs there (``tests/sdk/pipecat_pipeline.py``) as a child process,
with its base URL set to this live server and a Parley API key. The echo engine returns the caller's
audio 240 ms later, so the agent audio pipecat hands downstream must hold the spoken file itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from websockets.sync.client import connect

from webapp.accounts.services import apikey_create

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
PIPECAT_PYTHON = ROOT / ".venv-pipecat" / "bin" / "python"
RUNNER = Path(__file__).resolve().parent / "pipecat_pipeline.py"
FRAME = 1920  # the echo engine's 80 ms at 24 kHz
SENTENCE = "The museum opens at nine in the morning and closes at five in the evening."


@pytest.fixture
def speech_wav(tmp_path) -> Path:
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install espeak-ng sox)")
    raw, wav = tmp_path / "espeak.wav", tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-s", "160", "-w", str(raw), SENTENCE], check=True, timeout=60)
    subprocess.run(["sox", str(raw), "-r", "24000", "-c", "1", "-b", "16", str(wav)], check=True, timeout=60)
    return wav


def start_the_engine(server, key: str) -> None:
    """Open and close one session first. The test server starts its inference service on the first connect
    (no warm start in tests), which holds that handshake for as long as loading takes on a busy machine, past
    the 10 s that pipecat's connect allows; a deployment warms the engine up as it starts."""
    headers = {"Authorization": f"Bearer {key}"}
    with connect(f"{server.ws_url}/v1/realtime?model=echo", additional_headers=headers, open_timeout=120) as ws:
        while json.loads(ws.recv(timeout=120))["type"] != "session.created":
            pass
        ws.send(json.dumps({"type": "session.close"}))
        while json.loads(ws.recv(timeout=30))["type"] != "session.closed":
            pass


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float64) / 32768


def best_match(needle: np.ndarray, haystack: np.ndarray) -> tuple[float, int]:
    """(normalised cross-correlation at its peak, the lag in samples): 1.0 when ``needle`` is in ``haystack``."""
    size = 1 << int(np.ceil(np.log2(len(needle) + len(haystack))))
    corr = np.fft.irfft(np.fft.rfft(haystack, size) * np.conj(np.fft.rfft(needle, size)), size)[: len(haystack)]
    energy = np.convolve(haystack**2, np.ones(len(needle)), "full")[len(needle) - 1 : len(haystack) + len(needle) - 1]
    score = corr / np.sqrt(np.maximum(energy, 1e-12) * np.sum(needle**2))
    lag = int(np.argmax(score))
    return float(score[lag]), lag


def test_pipecat_realtime_service_turns_a_speech_file_into_agent_audio(channels_live_server, speech_wav, tmp_path):
    if not PIPECAT_PYTHON.exists():
        pytest.skip(".venv-pipecat is not installed (scripts/install-python.sh test installs it)")
    user = get_user_model().objects.create_user(username="pipecat-user", password="unused-password-1")
    _, key = apikey_create(user=user, name="pipecat")
    start_the_engine(channels_live_server, key)
    out = tmp_path / "agent"
    run = subprocess.run(
        [str(PIPECAT_PYTHON), str(RUNNER), f"{channels_live_server.ws_url}/v1", key, "echo", str(speech_wav), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(Path(f"{out}.json").read_text())
    assert result["errors"] == [], result["errors"]
    assert result["rates"] == [24000]

    with wave.open(str(speech_wav)) as wav:
        spoken = pcm(wav.readframes(wav.getnframes()))
    heard = pcm(Path(f"{out}.pcm").read_bytes())
    # The echo engine steps 80 ms frames on its own clock: on a busy machine a frame that arrives late leaves a
    # tick of silence between two echoed frames, so the sentence comes back frame by frame, not in one piece.
    # The spoken frames must be there intact, in order: at least 90 % of them (measured: 52 of 52, and 50 of 52
    # when the machine was loaded and the session's first two frames, at the engine's start, came back cut).
    frames = [spoken[i : i + FRAME] for i in range(0, len(spoken) - FRAME + 1, FRAME)]
    voiced = [frame for frame in frames if np.abs(frame).max() > 0.02]
    matches = [best_match(frame, heard) for frame in voiced]
    found = [lag for score, lag in matches if score > 0.999]
    assert len(voiced) >= 20 and len(found) >= 0.9 * len(voiced), (len(found), len(voiced), matches)
    assert found == sorted(found)  # in the order spoken
