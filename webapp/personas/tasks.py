"""Celery tasks of the personas app: turning an uploaded clip into a usable voice."""

from __future__ import annotations

from celery import shared_task

from webapp.personas.services import voice_process


@shared_task(name="personas.process_voice", acks_late=True)
def process_voice(voice_id: int) -> str:
    """Decode, validate and compute the prompts of one voice; returns ``ready``, ``failed`` or ``skipped``."""
    return voice_process(voice_id=voice_id)
