"""Persona and voice writes (keyword-only, typed), the voice-processing pipeline, and voice -> engine reference.

Views, the admin, ``importvoices`` and the Celery task all write through here, so the rules (a new version per
persona edit, nothing half-made when a clip is refused, consent recorded with the voice) live in one place.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from django.db.models.fields.files import FieldFile
from django.utils import timezone

from inference import api
from inference.contracts import ParleyError, VoiceRef
from webapp.personas.models import Persona, Voice, VoicePrompt

logger = logging.getLogger(__name__)

# Every word is in PocketSphinx's US-English dictionary, so the consent check can listen for it.
CONSENT_WORDS = (
    "amber", "birch", "cobalt", "delta", "ember", "falcon", "granite", "harbor", "indigo", "juniper", "kettle",
    "lantern", "meadow", "nimbus", "orchid", "pepper", "quartz", "river", "saffron", "tundra", "uniform", "velvet",
    "willow", "zephyr",
)  # fmt: skip
CONSENT_MIN_SPEECH_S = 1.0  # the consent sentence is short; it must still be real speech


class VoiceError(Exception):
    """A voice request that cannot be carried out, with a message for the person who made it."""


# ---- personas -------------------------------------------------------------------------------------------


def persona_create(
    *, owner: AbstractBaseUser | None, name: str, instructions: str, default_voice: Voice | None, by: AbstractBaseUser
) -> Persona:
    persona = Persona(owner=owner, name=name, instructions=instructions, default_voice=default_voice)
    persona.save(edited_by=by)
    return persona


def persona_edit(
    *, persona: Persona, name: str, instructions: str, default_voice: Voice | None, by: AbstractBaseUser
) -> Persona:
    """Saving makes a new version when name, instructions or default voice changed (``Persona.save``)."""
    persona.name, persona.instructions, persona.default_voice = name, instructions, default_voice
    persona.save(edited_by=by)
    return persona


def persona_set_archived(*, persona: Persona, archived: bool) -> None:
    persona.archived = archived
    persona.save(update_fields=["archived", "updated_at"])


# ---- voices: creation ------------------------------------------------------------------------------------


def consent_sentence(*, user: AbstractBaseUser) -> tuple[str, str]:
    """(sentence, random phrase): the person reads the sentence aloud; the phrase makes a replay useless."""
    phrase = " ".join(secrets.choice(CONSENT_WORDS) for _ in range(3))
    sentence = (
        f"I am {user.get_username()}, and I agree that Parley may create a synthetic copy of my voice. "
        f"My phrase is: {phrase}."
    )
    return sentence, phrase


@dataclass(frozen=True)
class Consent:
    """The person reading ``sentence`` (which holds the random ``phrase``) aloud, as an audio file."""

    audio: bytes
    sentence: str
    phrase: str


def voice_create_clone(
    *,
    owner: AbstractBaseUser | None,
    by: AbstractBaseUser,
    name: str,
    clip: bytes,
    consent: Consent,
) -> Voice:
    """Store a cloned voice as ``pending`` with its consent record, then queue its processing.

    Both files are probed first (their container headers, nothing decoded): a file that is not audio, or whose
    header declares more than the caps (a decompression bomb), is refused here and nothing is stored. The consent
    recording must be real speech: it is decoded (in the limited child process ``prepare_voice_clip`` uses) and
    checked before anything is stored; the clip is decoded later, by the voice task. Each file is stored under
    the extension of what the probe found, never the one in the name the client sent.

    Raises:
        VoiceError: duplicate name, an unusable clip header, or an unusable consent recording.
    """
    if not consent.phrase or consent.phrase not in consent.sentence:
        raise VoiceError("The consent step is missing: read the displayed sentence aloud and record it.")
    try:
        clip_header = api.probe_voice_clip(clip)
    except ParleyError as exc:
        raise VoiceError(f"The clip cannot be used: {exc.message}") from exc
    try:
        consent_header = api.probe_voice_clip(consent.audio)
        prepared = api.prepare_voice_clip(consent.audio, min_speech_s=CONSENT_MIN_SPEECH_S)
        if settings.PARLEY_VERIFY_CONSENT_PHRASE:
            api.require_spoken_phrase(prepared, consent.phrase)
    except ParleyError as exc:
        raise VoiceError(f"The consent recording cannot be used: {exc.message}") from exc
    voice_check_name(owner=owner, name=name)
    try:
        with transaction.atomic():
            voice = Voice(
                owner=owner,
                name=name,
                kind=Voice.Kind.CLONED,
                created_by=by,
                consent_text=consent.sentence,
                consent_phrase=consent.phrase,
                consented_by=by,
                consented_at=timezone.now(),
                progress_stage="queued",
            )
            voice.save()
            voice.reference_audio.save("clip" + clip_header.extension, ContentFile(clip), save=False)
            voice.consent_audio.save("consent" + consent_header.extension, ContentFile(consent.audio), save=False)
            voice.save(update_fields=["reference_audio", "consent_audio"])
    except IntegrityError as exc:  # the same name, created concurrently
        raise VoiceError(f"A voice named {name!r} already exists.") from exc
    _enqueue(voice)
    return voice


def _enqueue(voice: Voice) -> None:
    from webapp.personas.tasks import process_voice

    # after commit: a worker must find the row and its files
    transaction.on_commit(lambda: process_voice.delay(voice.pk))


def voice_check_name(*, owner: AbstractBaseUser | None, name: str) -> None:
    """Raises ``VoiceError`` unless ``name`` is a valid name not yet taken among ``owner``'s voices."""
    if not name or len(name) > 100:
        raise VoiceError("A voice needs a name of 1 to 100 characters.")
    if Voice.objects.filter(owner=owner, name=name).exists():
        raise VoiceError(f"A voice named {name!r} already exists.")


def voice_disable(*, voice: Voice, by: AbstractBaseUser) -> None:
    voice.status, voice.disabled_by, voice.disabled_at = Voice.Status.DISABLED, by, timezone.now()
    voice.save(update_fields=["status", "disabled_by", "disabled_at", "updated_at"])


def voice_enable(*, voice: Voice) -> None:
    """Undo a disable: ready again if its processing had finished, else failed as before."""
    voice.status = Voice.Status.READY if voice.duration_s is not None or voice.prompts.exists() else Voice.Status.FAILED
    voice.disabled_by, voice.disabled_at = None, None
    voice.save(update_fields=["status", "disabled_by", "disabled_at", "updated_at"])


def voice_retry(*, voice: Voice) -> None:
    """Process a failed voice's stored clip again (a fault on the way may not happen twice)."""
    if voice.status != Voice.Status.FAILED or not voice.reference_audio:
        raise VoiceError("Only a failed voice with its clip can be tried again.")
    voice.status, voice.failure_reason = Voice.Status.PENDING, ""
    voice.progress_stage, voice.progress_percent = "queued", 0
    voice.save(update_fields=["status", "failure_reason", "progress_stage", "progress_percent", "updated_at"])
    _enqueue(voice)


def voice_delete(*, voice: Voice) -> None:
    """Delete a failed voice and its files (a voice that calls may use is disabled instead, by staff)."""
    if voice.status != Voice.Status.FAILED:
        raise VoiceError("Only a failed voice can be deleted.")
    for prompt in voice.prompts.all():
        prompt.file.delete(save=False)
    for field in (voice.reference_audio, voice.consent_audio, voice.processed_audio):
        if field:
            field.delete(save=False)
    voice.delete()


# ---- voices: processing (the Celery task's body) ---------------------------------------------------------


def voice_process(*, voice_id: int) -> str:
    """Decode, clean and validate the reference clip, then compute every prompt the engine can use.

    Progress (stage + percent) is written to the row as it goes; the outcome is ``ready`` or ``failed`` with the
    exact reason. A failed clip leaves no processed audio and no prompts behind.
    """
    voice = Voice.objects.filter(pk=voice_id).first()
    if voice is None or voice.status not in (Voice.Status.PENDING, Voice.Status.PROCESSING):
        return "skipped"
    _progress(voice, "reading the clip", 0, status=Voice.Status.PROCESSING)
    try:
        with voice.reference_audio.open("rb") as handle:
            data = handle.read(api.voice_limits()["max_bytes"] + 1)
        clip = api.prepare_voice_clip(data, progress=lambda stage, f: _progress(voice, stage, 5 + 45 * f))
        voice.processed_audio.save("voice-24k.wav", ContentFile(clip.wav), save=False)
        voice.duration_s = clip.speech_s
        voice.save(update_fields=["processed_audio", "duration_s"])
        targets = api.voice_prompt_targets()
        for index, target in enumerate(targets):
            report = _share_of_progress(voice, target.family, start=50 + index * 45 / len(targets),
                                        width=45 / len(targets))  # fmt: skip
            blob = api.compute_voice_prompt(cached_local_path(voice.processed_audio), target, progress=report)
            voice_store_prompt(voice, family=target.family, model_key=target.model_key, blob=blob)
    except ParleyError as exc:
        _fail(voice, exc.message)
        return "failed"
    except Exception as exc:  # an unexpected fault must still end in a clear state, not "processing" forever
        logger.exception("voices.process_failed", extra={"voice_id": voice_id})
        _fail(voice, f"Internal error while processing the clip ({type(exc).__name__}); please try again.")
        return "failed"
    voice.status, voice.failure_reason = Voice.Status.READY, ""
    voice.progress_stage, voice.progress_percent = "ready", 100
    voice.save(update_fields=["status", "failure_reason", "progress_stage", "progress_percent", "updated_at"])
    return "ready"


def _share_of_progress(voice: Voice, family: str, *, start: float, width: float):
    """A progress callback mapping one prompt's [0, 1] onto its share of the page's percent."""
    return lambda stage, fraction: _progress(voice, f"{family}: {stage}", start + width * fraction)


def _progress(voice: Voice, stage: str, percent: float, *, status: str | None = None) -> None:
    stage, percent = stage[:60], int(max(0, min(100, percent)))
    if status is None and (stage, percent) == (voice.progress_stage, voice.progress_percent):
        return  # callbacks come per frame; the page only needs whole-percent steps
    voice.progress_stage, voice.progress_percent = stage, percent
    fields = ["progress_stage", "progress_percent", "updated_at"]
    if status is not None:
        voice.status = status
        fields.append("status")
    voice.save(update_fields=fields)


def _fail(voice: Voice, reason: str) -> None:
    """Failed, with the reason; whatever the run had made so far is removed (nothing half-made)."""
    for prompt in voice.prompts.all():
        prompt.file.delete(save=False)
        prompt.delete()
    if voice.processed_audio:
        voice.processed_audio.delete(save=False)
    voice.status, voice.failure_reason, voice.duration_s = Voice.Status.FAILED, reason, None
    voice.progress_stage = "failed"
    voice.save(
        update_fields=["status", "failure_reason", "duration_s", "processed_audio", "progress_stage", "updated_at"]
    )


def voice_store_prompt(voice: Voice, *, family: str, model_key: str, blob: bytes) -> VoicePrompt:
    prompt = VoicePrompt(voice=voice, family=family, model_key=model_key)
    prompt.file.save(f"{voice.storage_key}-{family}-{model_key}.safetensors", ContentFile(blob), save=False)
    prompt.save()
    return prompt


# ---- voice -> what the engine reads ----------------------------------------------------------------------


def voice_ref(voice: Voice) -> VoiceRef:
    """The file the configured engine should read for ``voice``: for a lockstep engine its Mimi-codes prompt for
    this engine's codec, or an imported PersonaPlex prompt; else the processed 24 kHz wav. The unit engine reads
    the wav (its vocoder needs the audio itself, and it embeds the clip as the stored embedding was made)."""
    try:
        targets = [t for t in api.voice_prompt_targets() if t.family == "lockstep"]
    except ParleyError:
        targets = []
    keys = {t.model_key for t in targets}
    lockstep = bool(targets)
    prompts = list(voice.prompts.all())
    chosen = next((p for p in prompts if p.model_key in keys), None)
    if chosen is None and lockstep:
        chosen = next((p for p in prompts if p.model_key == "personaplex-pt"), None)
    source = chosen.file if chosen is not None else voice.processed_audio
    return VoiceRef(voice_id=str(voice.pk), path=cached_local_path(source) if source else None)


def cached_local_path(field: FieldFile) -> Path:
    """A local path for a stored file: the storage's own path when it has one, else a cached download."""
    try:
        return Path(field.path)
    except NotImplementedError:  # remote storage (S3): keep a local copy the engine can read
        target = Path(settings.VAR_DIR) / "cache" / "voices" / field.name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with field.open("rb") as source, tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
                for chunk in iter(lambda: source.read(1 << 20), b""):
                    tmp.write(chunk)
            Path(tmp.name).replace(target)
        return target

