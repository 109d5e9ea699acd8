"""A cloned voice's consent recording must say the form's random phrase (PARLEY_VERIFY_CONSENT_PHRASE)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.librivox import sentence_path
from webapp.personas import services
from webapp.personas.models import Voice

from .test_personas_voices import client_for, new_voice, speech, users, wav  # noqa: F401 - users is a fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def phrase_checked(settings, monkeypatch):
    """The check on, and the form's phrase one a LibriVox reader says ("john dashwood", in sentence 0870)."""
    settings.PARLEY_VERIFY_CONSENT_PHRASE = True
    sentence = (
        "I am alice, and I agree that Parley may create a synthetic copy of my voice. My phrase is: john dashwood."
    )
    monkeypatch.setattr(services, "consent_sentence", lambda *, user: (sentence, "john dashwood"))


def test_the_right_phrase_passes(client, users, phrase_checked, django_capture_on_commit_callbacks):  # noqa: F811
    with django_capture_on_commit_callbacks(execute=True):
        response, _ = new_voice(client_for(client, users["alice"]), "mine", wav(speech(5.0)),
                                consent=sentence_path("0870").read_bytes())  # fmt: skip
    assert response.status_code == 200, response.content
    assert Voice.objects.get(name="mine").consent_phrase == "john dashwood"


def test_a_different_sentence_is_refused_with_the_reason(client, users, phrase_checked):  # noqa: F811
    response, _ = new_voice(client_for(client, users["alice"]), "x", wav(speech(5.0)),
                            consent=sentence_path("0890").read_bytes())  # fmt: skip
    assert response.status_code == 400
    body = json.dumps(response.json())
    assert "consent recording cannot be used" in body and "john dashwood" in body and "was not heard" in body
    assert not Voice.objects.exists()


def test_silence_is_refused(client, users, phrase_checked):  # noqa: F811
    response, _ = new_voice(client_for(client, users["alice"]), "x", wav(speech(5.0)),
                            consent=wav(np.zeros(48_000 * 3, np.float32)))  # fmt: skip
    assert response.status_code == 400 and "consent recording cannot be used" in json.dumps(response.json())
    assert not Voice.objects.exists()
