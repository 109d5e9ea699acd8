"""Personas and voices through their pages: versions, permissions on every route, the voice task (eager) from
upload to ready or to an exact failure, consent records, size limits, staff disable, importvoices."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import soundfile
from django.core.management import call_command
from django.urls import reverse

from webapp.personas.models import Persona, PersonaVersion, Voice, VoicePrompt

pytestmark = pytest.mark.django_db
DATA = Path(__file__).resolve().parents[2] / "data" / "personaplex"
RATE = 48_000


def speech(seconds: float, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amp * 0.5 * (1 + np.sin(2 * np.pi * 3 * t)) * np.sin(2 * np.pi * (180 + 40 * np.sin(t)) * t)).astype(
        np.float32
    )


def wav(x: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, x, RATE, format="WAV")
    return buffer.getvalue()


def upload(data: bytes, name: str = "clip.wav"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, data)


# Staff act on other users' rows by explicit grants only (tests/webapp/security/test_object_permissions.py).
STAFF_GRANTS = {"personas": ("view_persona", "change_persona", "view_voice"), "operations": ("disable_voice",)}


@pytest.fixture
def users(django_user_model):
    from django.contrib.auth.models import Permission

    make = django_user_model.objects.create_user
    staff = make("staff", password="pw", is_staff=True)
    for app, codenames in STAFF_GRANTS.items():
        staff.user_permissions.add(*Permission.objects.filter(content_type__app_label=app, codename__in=codenames))
    return {"alice": make("alice", password="pw"), "bob": make("bob", password="pw"), "staff": staff}


def client_for(client, user):
    client.force_login(user)
    return client


# ---- personas -------------------------------------------------------------------------------------------


def test_every_edit_makes_a_new_version(client, users):
    c = client_for(client, users["alice"])
    response = c.post(reverse("personas:persona-create"), {"name": "Guide", "instructions": "You guide."})
    persona = Persona.objects.get(name="Guide")
    assert response.status_code == 302 and persona.owner == users["alice"] and persona.version == 1
    c.post(reverse("personas:persona-edit", args=[persona.pk]), {"name": "Guide", "instructions": "You guide well."})
    c.post(reverse("personas:persona-edit", args=[persona.pk]), {"name": "Guide", "instructions": "You guide well."})
    persona.refresh_from_db()
    assert persona.version == 2, "an unchanged save makes no version"
    versions = list(PersonaVersion.objects.filter(persona=persona).order_by("number"))
    assert [(v.number, v.instructions) for v in versions] == [(1, "You guide."), (2, "You guide well.")]
    assert versions[1].created_by == users["alice"]
    page = c.get(reverse("personas:persona-versions", args=[persona.pk])).content.decode()
    assert "You guide." in page and "You guide well." in page and "version 2" in page


def test_archive_hides_from_the_call_page_but_keeps_the_rows(client, users):
    persona = Persona.objects.create(owner=users["alice"], name="Old", instructions="ancient words")
    c = client_for(client, users["alice"])
    c.post(reverse("personas:persona-archive", args=[persona.pk]), {"archived": "1"})
    persona.refresh_from_db()
    assert persona.archived
    assert "ancient words" not in c.get(reverse("calls:call")).content.decode()
    assert "ancient words" not in c.get(reverse("personas:persona-list")).content.decode()
    assert "ancient words" in c.get(reverse("personas:persona-list") + "?archived=1").content.decode()


def test_empty_instructions_are_refused(client, users):
    response = client_for(client, users["alice"]).post(
        reverse("personas:persona-create"), {"name": "X", "instructions": "   "}
    )
    assert response.status_code == 200 and "This field is required" in response.content.decode()
    assert not Persona.objects.exists()


def persona_routes(pk: int) -> list[tuple[str, str]]:
    return [
        ("get", reverse("personas:persona-edit", args=[pk])),
        ("post", reverse("personas:persona-edit", args=[pk])),
        ("post", reverse("personas:persona-archive", args=[pk])),
        ("get", reverse("personas:persona-versions", args=[pk])),
    ]


def voice_routes(pk: int) -> list[tuple[str, str]]:
    return [
        ("get", reverse("personas:voice-detail", args=[pk])),
        ("get", reverse("personas:voice-status", args=[pk])),
        ("get", reverse("personas:voice-preview", args=[pk])),
    ]


def test_another_user_cannot_list_use_preview_or_download_private_rows(client, users):
    persona = Persona.objects.create(owner=users["alice"], name="Alice private", instructions="secret text")
    voice = make_ready_voice(users["alice"], "alicevoice")
    bob = client_for(client, users["bob"])
    for method, url in persona_routes(persona.pk) + voice_routes(voice.pk):
        response = getattr(bob, method)(url, {"name": "hack", "instructions": "x"} if method == "post" else None)
        assert response.status_code == 404, (method, url, response.status_code)
    for url in (reverse("personas:persona-list"), reverse("personas:voice-list"), reverse("calls:call")):
        page = bob.get(url).content.decode()
        assert "Alice private" not in page and "alicevoice" not in page and "secret text" not in page
    persona.refresh_from_db()
    assert persona.name == "Alice private" and not persona.archived and persona.version == 1
    # the owner and staff with the view permissions can
    for user in (users["alice"], users["staff"]):
        c = client_for(client, user)
        assert c.get(reverse("personas:voice-preview", args=[voice.pk])).status_code == 200
        assert c.get(reverse("personas:persona-versions", args=[persona.pk])).status_code == 200


def test_shared_rows_are_visible_but_only_staff_with_change_persona_edit_them(client, users):
    shared = Persona.objects.create(owner=None, name="Shared", instructions="for all")
    bob = client_for(client, users["bob"])
    assert bob.get(reverse("personas:persona-versions", args=[shared.pk])).status_code == 200
    assert bob.post(reverse("personas:persona-edit", args=[shared.pk]), {"name": "x", "instructions": "y"}).status_code == 403
    staff = client_for(client, users["staff"])
    staff.post(reverse("personas:persona-edit", args=[shared.pk]), {"name": "Shared", "instructions": "new", "shared": "on"})
    shared.refresh_from_db()
    assert shared.instructions == "new" and shared.owner is None and shared.version == 2


# ---- voices -------------------------------------------------------------------------------------------------


def make_ready_voice(owner, name: str) -> Voice:
    """A voice processed by the real pipeline (eager task) from a generated clip."""
    from webapp.personas.services import voice_process

    voice = Voice.objects.create(owner=owner, name=name, kind=Voice.Kind.BUILTIN)
    voice.reference_audio.save("clip.wav", _content(wav(speech(4.0))), save=True)
    assert voice_process(voice_id=voice.pk) == "ready"
    voice.refresh_from_db()
    return voice


def _content(data: bytes):
    from django.core.files.base import ContentFile

    return ContentFile(data)


def new_voice(client, name: str, clip: bytes, consent: bytes | None = None, clip_name: str = "clip.wav"):
    page = client.get(reverse("personas:voice-new"))
    assert page.status_code == 200
    sentence = page.context["consent_sentence"]
    assert "My phrase is:" in sentence
    fields = {"name": name, "clip": upload(clip, clip_name), "consent": upload(consent or wav(speech(3.0)), "c.wav")}
    return client.post(reverse("personas:voice-new"), fields, HTTP_ACCEPT="application/json"), sentence


def test_upload_runs_the_task_eagerly_to_ready_with_consent_recorded(client, users, django_capture_on_commit_callbacks):
    c = client_for(client, users["alice"])
    with django_capture_on_commit_callbacks(execute=True):
        response, sentence = new_voice(c, "mine", wav(np.concatenate([np.zeros(RATE), speech(5.0)])))
    assert response.status_code == 200, response.content
    voice = Voice.objects.get(name="mine")
    assert voice.status == "ready" and voice.progress_percent == 100 and 4.9 < voice.duration_s < 5.5
    assert voice.owner == users["alice"] and voice.consented_by == users["alice"] and voice.consented_at
    assert voice.consent_text == sentence and voice.consent_phrase in sentence
    assert voice.consent_audio.name.endswith("/consent.wav") and voice.reference_audio.name.endswith("/clip.wav")
    status = c.get(reverse("personas:voice-status", args=[voice.pk])).json()
    assert status["status"] == "ready" and status["percent"] == 100
    preview = c.get(reverse("personas:voice-preview", args=[voice.pk]))
    pcm, rate = soundfile.read(io.BytesIO(b"".join(preview.streaming_content)))
    assert rate == 24_000 and 0 < len(pcm) <= 5 * 24_000
    assert not str(voice.reference_audio.path).startswith(str(Path("static").resolve())), "uploads outside static"


@pytest.mark.parametrize(
    ("clip", "reason"),
    [
        (b"", "empty"),
        (b"plain text, not audio at all" * 20, "not an audio file"),
        (wav(np.zeros(RATE * 5, np.float32)), "silent"),
        (wav(speech(1.0)), "at least 3 s"),
        (wav(np.clip(speech(5.0, amp=3.0), -1, 1)), "clipped"),
    ],
)
def test_a_bad_clip_fails_with_the_exact_reason_and_leaves_nothing(client, users, django_capture_on_commit_callbacks,
                                                                   clip, reason):  # fmt: skip
    c = client_for(client, users["alice"])
    with django_capture_on_commit_callbacks(execute=True):
        response, _ = new_voice(c, "bad", clip)
    if response.status_code == 400:  # refused at the upload: by the form (empty) or by the header probe
        assert reason in ("empty", "not an audio file") and reason in json.dumps(response.json())
        assert not Voice.objects.exists(), "nothing stored"
        return
    voice = Voice.objects.get(name="bad")
    assert voice.status == "failed" and reason in voice.failure_reason
    assert not voice.processed_audio and not voice.prompts.exists()
    assert c.get(reverse("personas:voice-status", args=[voice.pk])).json()["reason"] == voice.failure_reason


def test_the_consent_recording_must_be_speech(client, users):
    c = client_for(client, users["alice"])
    response, _ = new_voice(c, "x", wav(speech(5.0)), consent=wav(np.zeros(RATE * 3, np.float32)))
    assert response.status_code == 400 and "consent recording cannot be used" in json.dumps(response.json())
    assert not Voice.objects.exists()


def test_a_duplicate_name_is_refused(client, users):
    Voice.objects.create(owner=users["alice"], name="taken")
    response, _ = new_voice(client_for(client, users["alice"]), "taken", wav(speech(5.0)))
    assert response.status_code == 400 and "already exists" in json.dumps(response.json())
    assert Voice.objects.filter(name="taken").count() == 1


def test_too_big_is_refused_before_the_body_is_read(client, users):
    c = client_for(client, users["alice"])
    c.get(reverse("personas:voice-new"))

    response = c.generic(
        "POST", reverse("personas:voice-new"), data=b"", content_type="multipart/form-data; boundary=x",
        HTTP_ACCEPT="application/json", CONTENT_LENGTH=str(25 * 1024 * 1024),
    )  # fmt: skip
    assert response.status_code == 413 and "too big" in json.dumps(response.json())
    assert not Voice.objects.exists()


def test_a_file_over_the_limit_is_cut_off_while_streaming(client, users):
    """The whole request fits the declared-length check (two files' worth), but one file passes 10 MB: the upload
    handler stops the body there."""
    c = client_for(client, users["alice"])
    c.get(reverse("personas:voice-new"))
    big = b"RIFF" + bytes(10 * 1024 * 1024 + 10)
    fields = {"name": "big", "clip": upload(big, "big.wav"), "consent": upload(wav(speech(3.0)), "c.wav")}
    response = c.post(reverse("personas:voice-new"), fields, HTTP_ACCEPT="application/json")
    assert response.status_code == 413 and "too big" in json.dumps(response.json())
    assert not Voice.objects.exists()


def test_staff_with_disable_voice_stop_new_calls_and_others_cannot(client, users):
    from webapp.conversations.services import voice_resolve

    voice = make_ready_voice(None, "shared-voice")
    assert voice_resolve(user=users["bob"], voice="shared-voice") is not None
    assert client_for(client, users["bob"]).post(reverse("personas:voice-disable", args=[voice.pk])).status_code == 403
    client_for(client, users["staff"]).post(reverse("personas:voice-disable", args=[voice.pk]))
    voice.refresh_from_db()
    assert voice.status == "disabled" and voice.disabled_by == users["staff"]
    assert voice_resolve(user=users["bob"], voice="shared-voice") is None
    assert voice_resolve(user=users["bob"], voice=voice.pk) is None


def test_only_a_failed_voice_is_deleted_and_only_by_its_owner_or_staff(client, users):
    failed = Voice.objects.create(owner=users["alice"], name="broken", status=Voice.Status.FAILED)
    ready = make_ready_voice(users["alice"], "working")
    delete = lambda voice: reverse("personas:voice-delete", args=[voice.pk])  # noqa: E731
    shared = Voice.objects.create(owner=None, name="shared-broken", status=Voice.Status.FAILED)
    assert client_for(client, users["bob"]).post(delete(failed)).status_code == 404  # private: not even seen
    assert client_for(client, users["bob"]).post(delete(shared)).status_code == 403
    client_for(client, users["alice"]).post(delete(ready))
    assert Voice.objects.filter(pk=ready.pk).exists()  # a usable voice is disabled by staff, never deleted here
    response = client_for(client, users["alice"]).post(delete(failed))
    assert response.status_code == 302 and not Voice.objects.filter(pk=failed.pk).exists()


def test_a_failed_voice_is_processed_again_from_its_clip(client, users, django_capture_on_commit_callbacks):
    client_for(client, users["alice"])
    with django_capture_on_commit_callbacks(execute=True):
        response = new_voice(client, "retried", wav(speech(6.0)))
    voice = Voice.objects.get(name="retried")
    assert voice.status == Voice.Status.READY, voice.failure_reason
    Voice.objects.filter(pk=voice.pk).update(status=Voice.Status.FAILED, failure_reason="a fault on the way")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("personas:voice-retry", args=[voice.pk]))
    assert response.status_code == 302
    voice.refresh_from_db()
    assert (voice.status, voice.failure_reason, voice.progress_percent) == (Voice.Status.READY, "", 100)


# ---- importvoices ---------------------------------------------------------------------------------------------


def tgz(tmp_path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    path = tmp_path / "voices.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def torch_bytes(obj) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_importvoices_from_a_tgz_imports_good_files_and_says_why_others_were_refused(tmp_path):
    Voice.objects.create(owner=None, name="exists")
    archive = tgz(
        tmp_path,
        {
            "voices/NATF0.pt": (DATA / "voice_prompt.pt").read_bytes(),
            "voices/clip.wav": wav(speech(4.0)),
            "voices/evil.pt": torch_bytes({"weights": __import__("torch").zeros(2)}),
            "../escape.wav": wav(speech(4.0)),
            "voices/silent.wav": wav(np.zeros(RATE * 4, np.float32)),
            "voices/exists.wav": wav(speech(4.0)),
        },
        links={"voices/link.wav": "/etc/passwd"},
    )
    out = io.StringIO()
    call_command("importvoices", str(archive), stdout=out)
    text = out.getvalue()
    assert "[" + "#" * 30 + "]" in text, "a progress bar"
    assert "Imported 2: voices/NATF0.pt, voices/clip.wav" in text
    assert "../escape.wav: path traversal" in text
    assert "voices/link.wav: a link" in text
    assert "voices/evil.pt: Not a PersonaPlex voice prompt" in text
    assert "voices/silent.wav: The clip is silent" in text
    assert "voices/exists.wav: duplicate name" in text
    assert set(Voice.objects.values_list("name", flat=True)) == {"exists", "NATF0", "clip"}
    natf = Voice.objects.get(name="NATF0")
    assert natf.status == "ready" and natf.kind == "builtin" and natf.owner is None
    prompt = VoicePrompt.objects.get(voice=natf)
    assert prompt.file.name.endswith(".safetensors") and prompt.model_key == "personaplex-pt"
    assert not (tmp_path / "escape.wav").exists() and not Path("escape.wav").exists()


def test_importvoices_from_a_folder_refuses_symlinks(tmp_path):
    folder = tmp_path / "voices"
    folder.mkdir()
    (folder / "calm.wav").write_bytes(wav(speech(4.0)))
    (folder / "sneaky.wav").symlink_to(folder / "calm.wav")
    out = io.StringIO()
    call_command("importvoices", str(folder), stdout=out)
    assert "Imported 1: calm.wav" in out.getvalue() and "sneaky.wav: a symlink" in out.getvalue()
