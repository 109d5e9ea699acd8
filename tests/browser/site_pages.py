"""Every page of the site, with rows behind it, for the layout and accessibility tests (test_screens_*.py).

``seed_site`` makes a staff user with every permission and one of each thing a page lists (a persona with a
default voice, a ready and a failed voice, a recording, an API key, an invite); ``site_pages`` names the pages.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import Permission
from django.utils import timezone

from webapp.accounts.models import Invite
from webapp.accounts.services import apikey_create
from webapp.personas.models import Persona, Voice
from webapp.recordings import annotations, sharing
from webapp.recordings.models import EvaluationExport, Label, Recording

LONG_INSTRUCTIONS = "You are a patient guide for a long museum tour. " * 12


@dataclass(frozen=True)
class Seeded:
    username: str
    persona: Persona
    voice: Voice
    failed_voice: Voice
    recording: Recording


def seed_site(make_user, username: str = "screens_staff") -> Seeded:
    user = make_user(username, staff=True)
    user.user_permissions.add(*Permission.objects.all())  # every nav entry and page a staff member can reach
    voice = Voice.objects.create(owner=user, name="Calm narrator", status=Voice.Status.READY, progress_percent=100)
    failed = Voice.objects.create(
        owner=user,
        name="Short clip",
        status=Voice.Status.FAILED,
        progress_percent=29,
        failure_reason="The clip has 1.2 s of speech; at least 3 s is needed.",
    )
    persona = Persona(owner=user, name="Museum guide", instructions=LONG_INSTRUCTIONS, default_voice=voice)
    persona.save(edited_by=user)
    recording = Recording.objects.create(
        user=user,
        session_id="sess_screens0001",
        engine="echo",
        persona_id=persona.pk,
        persona_name=persona.name,
        persona_version=persona.version,
        voice=voice.name,
        started_at=timezone.now(),
        ended_at=timezone.now(),
        status=Recording.Status.FAILED,
        status_reason="The raw recording was missing.",
        close_reason="client_close",
    )
    _review(user, recording)
    apikey_create(user=user, name="laptop")
    Invite.objects.create(code="invite-code-for-screens", note="a friend", created_by=user)
    return Seeded(username, persona, voice, failed, recording)


def _review(user, recording: Recording) -> None:
    """A labelled span, a rating, a tag, a share and an export, so the review panel and the list show each."""
    from tests.webapp.recordings.conftest import seed_review_set

    seed_review_set()  # a transactional test's flush emptied migration 0005's rows
    label = Label.objects.get(name="talked over the caller")
    span = annotations.SpanRequest(label.pk, 0.4, 2.2, "the agent started before the caller had finished")
    annotations.annotation_add(recording=recording, author=user, span=span)
    annotations.rating_set(recording=recording, author=user, stars=3)
    annotations.tag_add(recording=recording, user=user, raw="interruptions")
    sharing.share_create(recording=recording, by=user, reviewer=None)
    EvaluationExport.objects.create(user=user, calls=1, status=EvaluationExport.Status.FAILED, reason="no audio")


def site_pages(seeded: Seeded) -> list[str]:
    """Paths of every page a signed-in staff member can open."""
    return [
        "/?raw=1",
        "/personas/",
        "/personas/new/",
        f"/personas/{seeded.persona.pk}/edit/",
        f"/personas/{seeded.persona.pk}/versions/",
        "/voices/",
        "/voices/new/",
        f"/voices/{seeded.voice.pk}/",
        f"/voices/{seeded.failed_voice.pk}/",
        "/accounts/keys/",
        "/accounts/invites/",
        "/recordings/",
        f"/recordings/{seeded.recording.pk}/",
        "/ops/",
        "/ops/console/",
    ]


ANONYMOUS_PAGES = ["/accounts/login/", "/accounts/signup/"]
