"""What a ``session.update`` (or a client secret's session configuration) does to a live session.

Validate everything first, then apply: a rejected configuration changes nothing. Only changes reach the
session, since stock clients resend unchanged fields with every update. The caller emits ``session.updated``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from channels.db import database_sync_to_async

from inference import api
from webapp.conversations import protocol as p
from webapp.conversations import services
from webapp.conversations.server_events import SessionView
from webapp.conversations.turn_settings import turn_update
from webapp.recordings import services as recordings


async def apply_session_config(
    config: p.SessionConfig,
    *,
    handle: api.SessionHandle,
    view: SessionView,
    user_id: object,
    sync_recording: Callable[[], Awaitable[None]],
) -> None:
    audio = config.audio
    current = (view.input_type, view.input_rate)
    input_type, input_rate = p.session_input_format(
        config, current=current, input_rates=view.input_rates, output_rate=view.output_rate
    )
    # Always asked, even with no persona or voice named: the account is checked on every update.
    choices = await database_sync_to_async(services.session_update_choices)(
        user_id=user_id,
        persona_id=config.duplex.persona_id if config.duplex else None,
        voice=audio.output.voice if audio and audio.output else None,
    )
    persona_id, persona_version, instructions = view.persona_id, view.persona_version, view.instructions
    persona_name = view.persona_name
    if (persona := choices.persona) is not None:
        persona_id, persona_version, instructions = persona.persona_id, persona.version, persona.instructions
        persona_name = persona.name
    elif config.instructions is not None and config.instructions != view.instructions:
        persona_id, persona_version, instructions, persona_name = None, None, config.instructions, None
    voice = choices.voice
    new_persona = instructions if instructions != view.instructions else None
    new_voice = voice.ref if voice is not None and voice.name != view.voice else None
    record = config.duplex.record if config.duplex and config.duplex.record is not None else None
    new_record = record if record is not None and record != view.record else None
    turns = turn_update(config, view)  # validated; applied first, as it is the likeliest refusal
    if turns is not None:
        await handle.set_mode(mode=turns.mode, turn_detection=turns.detection, max_response_s=turns.max_response_s)
        turns.apply(view)
        await sync_recording()  # the recording names the mode
    record_video = config.duplex.record_video if config.duplex else None
    if new_persona is not None or new_voice is not None or new_record is not None or record_video is not None:
        await handle.update(persona=new_persona, voice=new_voice, record=new_record, record_video=record_video)
    view.input_type, view.input_rate = input_type, input_rate
    named = (persona_id, persona_version, voice.voice_id if voice else view.voice_id)
    renamed = named != (view.persona_id, view.persona_version, view.voice_id)
    view.persona_id, view.persona_version, view.instructions = persona_id, persona_version, instructions
    view.persona_name = persona_name
    if voice is not None:
        view.voice, view.voice_id = voice.name, voice.voice_id
    if renamed and new_record is None:
        await sync_recording()  # the recording names the persona version and voice chosen here
    if config.duplex and config.duplex.binary_audio is not None:
        view.binary_audio = config.duplex.binary_audio
    if new_record is not None:
        view.record = recordings.record_effective(view.capabilities, new_record)
        await sync_recording()
