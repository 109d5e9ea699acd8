"""Review pages and their files: who sees what, filters, zip, delete (files included)."""

from __future__ import annotations

import io
import zipfile

import pytest
from django.urls import reverse

from webapp.recordings import services
from webapp.recordings.models import Recording
from webapp.recordings.storage import recordings_storage

from .conftest import record_raw_call

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def processed(recorder, media_dir, make_recording, django_user_model):
    owner = django_user_model.objects.create_user(username="owner", password="x")
    recording = make_recording(owner, session_id="sess_owned")
    record_raw_call(recorder, "sess_owned", steps=20)
    services.recording_close(session_id="sess_owned", reason="client_close")
    recording.refresh_from_db()
    assert recording.status == Recording.Status.READY
    return recording


def routes(recording: Recording) -> list[tuple[str, str]]:
    pk = recording.pk
    return [
        ("get", reverse("recording-detail", args=[pk])),
        ("get", reverse("recording-status", args=[pk])),
        *[
            ("get", reverse("recording-file", args=[pk, kind]))
            for kind in ("ogg", "wav", "peaks", "transcript", "timeline")
        ],
        ("get", reverse("recording-zip", args=[pk])),
        ("post", reverse("recording-delete", args=[pk])),
        ("get", reverse("recording-delete", args=[pk])),
    ]


def test_another_users_recording_is_404_on_every_route(client, processed, django_user_model):
    django_user_model.objects.create_user(username="stranger", password="x")
    client.force_login(django_user_model.objects.get(username="stranger"))
    for method, url in routes(processed):
        assert getattr(client, method)(url).status_code == 404, url
    listed = client.get(reverse("recording-statuses"), {"ids": str(processed.pk)}).json()
    assert listed == {"recordings": []}
    assert processed.session_id not in client.get(reverse("recording-list")).content.decode()
    assert Recording.objects.filter(pk=processed.pk).exists()  # the stranger's delete did nothing


def test_anonymous_users_are_sent_to_log_in(client, processed):
    for method, url in routes(processed):
        response = getattr(client, method)(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url


def test_the_owner_gets_page_files_and_zip(client, processed, django_user_model):
    client.force_login(django_user_model.objects.get(username="owner"))
    page = client.get(reverse("recording-detail", args=[processed.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="wave-caller"' in body and 'id="transcript"' in body and "data-ogg-url=" in body
    ogg = client.get(reverse("recording-file", args=[processed.pk, "ogg"]))
    assert ogg["Content-Type"] == "audio/ogg" and b"".join(ogg.streaming_content).startswith(b"OggS")
    assert client.get(reverse("recording-file", args=[processed.pk, "nonsense"])).status_code == 404
    archive = zipfile.ZipFile(io.BytesIO(client.get(reverse("recording-zip", args=[processed.pk])).content))
    assert set(archive.namelist()) == {
        "stereo.ogg", "stereo.wav", "peaks.json", "transcript.json", "timeline.json", "transcript.txt"
    }  # fmt: skip
    assert "Hello there." in archive.read("transcript.txt").decode()


def test_staff_with_view_recording_see_everyones_recordings(client, processed, django_user_model):
    from django.contrib.auth.models import Permission

    boss = django_user_model.objects.create_user(username="boss", password="x", is_staff=True)
    boss.user_permissions.add(Permission.objects.get(codename="view_recording"))
    client.force_login(django_user_model.objects.get(username="boss"))
    assert client.get(reverse("recording-detail", args=[processed.pk])).status_code == 200
    page = client.get(reverse("recording-list")).content.decode()
    assert "owner" in page and "everyone" in page
    assert "No recordings" in client.get(reverse("recording-list"), {"mine": "on"}).content.decode()


def test_delete_removes_the_row_and_its_stored_files(client, processed, django_user_model):
    names = list(processed.files.values())
    storage = recordings_storage()
    assert all(storage.exists(name) for name in names)
    client.force_login(django_user_model.objects.get(username="owner"))
    response = client.post(reverse("recording-delete", args=[processed.pk]))
    assert response.status_code == 302
    assert not Recording.objects.filter(pk=processed.pk).exists()
    assert not any(storage.exists(name) for name in names)


def test_list_filters_search_and_pages(client, make_recording, django_user_model):
    user = django_user_model.objects.create_user(username="lister", password="x")
    for i in range(25):
        make_recording(
            user,
            session_id=f"sess_list{i:02d}",
            engine="moshi" if i % 5 == 0 else "echo",
            status="ready" if i % 2 else "failed",
            duration_s=float(i),
            persona_name="Pirate" if i == 7 else "Tutor",
            transcript_text="ahoy matey" if i == 7 else "",
        )
    client.force_login(django_user_model.objects.get(username="lister"))

    def rows(**params) -> int:
        return client.get(reverse("recording-list"), params).content.decode().count("data-recording=")

    assert rows() == 20 and rows(page=2) == 5  # paginated
    assert rows(engine="moshi") == 5
    assert rows(status="failed") == 13
    assert rows(q="matey") == 1 and rows(persona="pirate") == 1
    assert rows(min_duration_s="10", max_duration_s="14.5") == 5
    bad = client.get(reverse("recording-list"), {"min_duration_s": "soon", "date_from": "yesterday"})
    assert bad.status_code == 200 and "Enter a number" in bad.content.decode()


def test_the_list_processes_calls_that_ended_with_nobody_listening(client, recorder, media_dir, make_recording):
    # A detached call whose grace expired: the service ended it, no consumer was there to say so.
    recording = make_recording(session_id="sess_forgotten")
    record_raw_call(recorder, "sess_forgotten", steps=10, finish="grace_expired")
    client.force_login(recording.user)
    client.get(reverse("recording-list"))  # eager here: processed inline, as the embedded default does
    recording.refresh_from_db()
    assert recording.status == Recording.Status.READY
    assert recording.close_reason == "grace_expired" and recording.ended_at is not None  # from the end marker


def test_ids_too_large_for_the_database_are_404_not_500(client, django_user_model):
    client.force_login(django_user_model.objects.create_user(username="huge", password="x"))
    huge = 10**30
    for url in (f"/recordings/{huge}/", f"/recordings/{huge}/status.json", f"/recordings/{huge}/files/ogg"):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/recordings/{huge}/delete").status_code == 404


def test_the_call_page_s_link_by_session_reaches_the_owner_s_recording_only(client, make_recording, django_user_model):
    owner = django_user_model.objects.create_user(username="linked", password="x")
    other = django_user_model.objects.create_user(username="stranger", password="x")
    recording = make_recording(owner, session_id="sess_linked")
    url = reverse("recording-of-session", args=["sess_linked"])
    client.force_login(owner)
    response = client.get(url)
    assert response.status_code == 302 and response["Location"] == reverse("recording-detail", args=[recording.pk])
    assert client.get(reverse("recording-of-session", args=["sess_nothing"])).status_code == 404
    client.force_login(other)
    assert client.get(url).status_code == 404  # another user's call is not even confirmed to exist
