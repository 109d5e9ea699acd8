"""Untrusted voice uploads (issue 30, findings 3, 6, 8c and 8d): probed from their container headers before a sample
is decoded, decoded only in a child process under memory and time limits, refused with typed errors, and stored
under the extension of what they are, never the one in the client's file name; importvoices holds one archive
member at a time.

The web process's memory is measured as its peak RSS (VmHWM, reset before each act through
/proc/self/clear_refs): a decompression bomb decoded in this process raises it by gigabytes."""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile
from django.core.files.base import ContentFile
from django.core.management import CommandError, call_command
from django.urls import reverse

from inference import api
from inference.clip_sandbox import SandboxLimits, prepare_clip_in_child
from inference.media_probe import MAX_RATE, VoiceClipError
from tests.webapp.personas.test_personas_voices import speech, tgz, wav
from webapp.personas.models import Voice
from webapp.personas.services import voice_process

pytestmark = pytest.mark.django_db
BOMB_RATE, BOMB_SECONDS = 655_350, 290
RSS_GROWTH_BOUND_MB = 400  # generous: the bomb decoded in-process costs ~2,400 MB


def silent_flac(rate: int, seconds: float) -> bytes:
    """FLAC of digital silence: constant subframes, so hours of samples take a few hundred kB."""
    buffer = io.BytesIO()
    with soundfile.SoundFile(buffer, "w", samplerate=rate, channels=1, format="FLAC", subtype="PCM_16") as out:
        block = np.zeros(1 << 20, np.int16)
        left = int(rate * seconds)
        while left > 0:
            out.write(block[: min(left, len(block))])
            left -= len(block)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def flac_bomb() -> bytes:
    bomb = silent_flac(BOMB_RATE, BOMB_SECONDS)  # 190 M samples
    assert len(bomb) < 800_000
    return bomb


def wav_with_fmt(*, tag: int | None = None, bits: int | None = None) -> bytes:
    """A 3 s speech WAV whose fmt chunk is rewritten: format tag and/or bits per sample."""
    data = bytearray(wav(speech(3.0)))
    fmt = data.index(b"fmt ")
    if tag is not None:
        struct.pack_into("<H", data, fmt + 8, tag)
    if bits is not None:
        struct.pack_into("<H", data, fmt + 8 + 14, bits)
    return bytes(data)


class PeakRss:
    """This process's peak resident memory since ``reset`` (Linux's VmHWM, which clear_refs 5 resets)."""

    def reset(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")
        self.start_mb = self._hwm_mb()

    def growth_mb(self) -> float:
        return self._hwm_mb() - self.start_mb

    @staticmethod
    def _hwm_mb() -> float:
        return int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) / 1024


@pytest.fixture
def peak_rss() -> PeakRss:
    return PeakRss()


@pytest.fixture
def alice(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("alice", password="pw"))
    return client


def post_form(client, clip: bytes, consent: bytes, *, clip_name: str = "clip.wav", consent_name: str = "c.wav"):
    """The voice page's form, as a browser without JavaScript posts it (the answer is the HTML page)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.get(reverse("personas:voice-new"))  # the consent sentence is put in the session
    fields = {"name": "v", "clip": SimpleUploadedFile(clip_name, clip), "consent": SimpleUploadedFile(consent_name, consent)}
    return client.post(reverse("personas:voice-new"), fields)


# ---- finding 3: decompression bombs -------------------------------------------------------------------------


@pytest.mark.parametrize("as_file", ["clip", "consent"])
def test_a_flac_bomb_is_refused_from_its_header_on_the_voice_page(alice, flac_bomb, peak_rss, as_file,
                                                                  django_capture_on_commit_callbacks):  # fmt: skip
    """694 kB declaring 655,350 Hz for 290 s: refused from the header in the request, nothing stored, and the web
    process (which also runs the eager voice task) never holds the decoded samples."""
    good = wav(speech(4.0))
    clip, consent = (flac_bomb, good) if as_file == "clip" else (good, flac_bomb)
    peak_rss.reset()
    with django_capture_on_commit_callbacks(execute=True):
        response = post_form(alice, clip, consent)
    growth = peak_rss.growth_mb()
    page = response.content.decode()
    assert response.status_code == 400
    assert f"declares a sample rate of {BOMB_RATE} Hz; at most {MAX_RATE} Hz are accepted" in page
    assert ("The clip cannot be used" if as_file == "clip" else "The consent recording cannot be used") in page
    assert not Voice.objects.exists()
    assert growth < RSS_GROWTH_BOUND_MB, f"the web process's peak RSS grew by {growth:.0f} MB"


def test_a_stored_bomb_fails_in_the_voice_task_without_touching_the_web_process(alice, django_user_model, flac_bomb,
                                                                                peak_rss):  # fmt: skip
    """A bomb that reached storage another way (an old row, importvoices) is refused by the task, which decodes
    only in its child: the reason is on the voice's page, and the process running the task stays small."""
    voice = Voice.objects.create(owner=django_user_model.objects.get(username="alice"), name="bomb")
    voice.reference_audio.save("clip.flac", ContentFile(flac_bomb), save=True)
    peak_rss.reset()
    assert voice_process(voice_id=voice.pk) == "failed"
    growth = peak_rss.growth_mb()
    voice.refresh_from_db()
    assert f"{BOMB_RATE} Hz" in voice.failure_reason and not voice.processed_audio
    assert f"{BOMB_RATE} Hz" in alice.get(reverse("personas:voice-detail", args=[voice.pk])).content.decode()
    assert growth < RSS_GROWTH_BOUND_MB, f"the task's process peak RSS grew by {growth:.0f} MB"


@pytest.fixture(scope="module")
def heavy_but_allowed() -> bytes:
    """Within every header cap (192 kHz, 150 s: 28.8 M samples), but ~0.5 GB to decode and prepare."""
    return silent_flac(192_000, 150)


def test_the_decode_runs_in_a_child_under_memory_and_time_limits(heavy_but_allowed, peak_rss):
    peak_rss.reset()
    with pytest.raises(VoiceClipError) as finished:  # default limits: decoded to the end, then judged
        prepare_clip_in_child(heavy_but_allowed, min_speech_s=3.0)
    assert finished.value.code == "silent"
    assert peak_rss.growth_mb() < 150, "the samples were decoded in the child, not here"
    limits = [SandboxLimits(memory_bytes=600 * 1024**2), SandboxLimits(cpu_s=1), SandboxLimits(wall_s=0.5)]
    for limit in limits:
        with pytest.raises(VoiceClipError) as stopped:
            prepare_clip_in_child(heavy_but_allowed, min_speech_s=3.0, limits=limit)
        assert stopped.value.code == "too_demanding", (limit, stopped.value.message)
        assert "Decoding the clip was stopped" in stopped.value.message


# ---- finding 6: a fmt chunk naming no codec -------------------------------------------------------------------


@pytest.mark.parametrize(("tag", "bits"), [(None, 0), (0xFFFF, None)], ids=["bits-0", "tag-FFFF"])
@pytest.mark.parametrize("as_file", ["clip", "consent"])
def test_a_wav_whose_fmt_chunk_names_no_codec_is_a_typed_refusal_not_a_500(alice, tag, bits, as_file):
    bad, good = wav_with_fmt(tag=tag, bits=bits), wav(speech(4.0))
    clip, consent = (bad, good) if as_file == "clip" else (good, bad)
    response = post_form(alice, clip, consent)
    assert response.status_code == 400
    assert "names no codec that can decode it" in response.content.decode()
    with pytest.raises(VoiceClipError) as refused:
        api.probe_voice_clip(bad)
    assert refused.value.code == "unsupported_codec"
    assert not Voice.objects.exists()


# ---- finding 8d: the stored extension comes from the content -------------------------------------------------


def test_the_stored_extension_is_the_detected_format_never_the_client_name(alice, django_capture_on_commit_callbacks):
    flac = io.BytesIO()
    soundfile.write(flac, speech(4.0), 48_000, format="FLAC")
    with django_capture_on_commit_callbacks(execute=True):
        response = post_form(alice, flac.getvalue(), wav(speech(3.0)), clip_name="clip.WAV;.html",
                             consent_name="consent.html")  # fmt: skip
    assert response.status_code == 302, response.content
    voice = Voice.objects.get(name="v")
    assert voice.reference_audio.name.endswith("/clip.flac"), voice.reference_audio.name
    assert voice.consent_audio.name.endswith("/consent.wav"), voice.consent_audio.name
    assert voice.status == "ready", voice.failure_reason


def test_importvoices_names_a_stored_clip_by_its_content(tmp_path):
    flac = io.BytesIO()
    soundfile.write(flac, speech(4.0), 48_000, format="FLAC")
    out = io.StringIO()
    call_command("importvoices", str(tgz(tmp_path, {"voices/calm.wav": flac.getvalue()})), stdout=out)
    assert "Imported 1: voices/calm.wav" in out.getvalue()
    assert Voice.objects.get(name="calm").reference_audio.name.endswith("/clip.flac")


# ---- finding 8c: importvoices holds one member at a time -----------------------------------------------------


def test_importvoices_reads_one_member_at_a_time(tmp_path, peak_rss):
    """60 members of 10 MB of zeros: a .tgz of well under 1 MB that is 600 MB once read. Each member is read,
    refused (not audio) and let go before the next, so memory holds one member, not the archive."""
    import tarfile

    path, zeros = tmp_path / "zeros.tgz", bytes(10_000_000)
    with tarfile.open(path, "w:gz") as tar:
        for index in range(60):
            info = tarfile.TarInfo(f"voices/z{index:02}.wav")
            info.size = len(zeros)
            tar.addfile(info, io.BytesIO(zeros))
    assert path.stat().st_size < 1_000_000
    out = io.StringIO()
    peak_rss.reset()
    call_command("importvoices", str(path), stdout=out)
    growth = peak_rss.growth_mb()
    assert "Refused 60:" in out.getvalue() and "voices/z59.wav: This is not an audio file" in out.getvalue()
    assert growth < 200, f"importing grew the peak RSS by {growth:.0f} MB"


def test_importvoices_refuses_an_archive_of_too_many_entries(tmp_path):
    from webapp.personas.management.commands.importvoices import MAX_ENTRIES

    archive = tgz(tmp_path, {f"voices/v{index}.wav": wav(speech(0.1)) for index in range(MAX_ENTRIES + 1)})
    with pytest.raises(CommandError, match=f"more than {MAX_ENTRIES} entries"):
        call_command("importvoices", str(archive), stdout=io.StringIO())
    assert not Voice.objects.exists()
