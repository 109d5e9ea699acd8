"""Property-based: no client input yields ``internal_error``, and a session survives every bad event.

Three levels, fastest first: the event parser and the ``session.update`` format validator on many
generated frames; the persona and voice lookups (the database) with whatever the parser lets
through; and, fewer examples, whole ``session.update`` events through a real WebSocket to a live
session that must still answer after each one. Generation mixes valid values with the kinds that
once reached an internal error: integer literals past Python's 4300-digit conversion limit, lone
UTF-16 surrogates, NUL characters, ids beyond a database integer, non-ASCII digits.

Deterministic (``derandomize``, no example database) with bounded example counts, so CI time and
results are the same on every run.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest
from channels.db import database_sync_to_async
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.webapp.realtime.realtime_helpers import ready_peer
from webapp.conversations import protocol as p
from webapp.conversations import services
from webapp.personas.models import Persona, Voice

PROPERTY = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
INPUT_RATES = (16_000, 24_000, 48_000)


@dataclass(frozen=True)
class Literal:
    """JSON text written as is: integer literals too long for ``json.dumps`` (it converts ints to str)."""

    text: str


def to_json(value: Any) -> str:
    """``json.dumps`` that also writes ``Literal``s; surrogates and NaN come out as Python's json writes them."""
    if isinstance(value, Literal):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value)


# Every code point, lone surrogates (category Cs) and NUL included.
any_text = st.text(st.characters(exclude_categories=()), max_size=40)
nasty_text = st.sampled_from(
    [
        "\ud800",
        "a\udfffb",
        "\x00",
        "calm\x00",
        "²",
        "١٢٣",
        "12\u00b3",
        "0",
        "-1",
        "1" * 19,
        "9" * 30,
        "",
        " ",
        "x" * 201,
    ]
)
huge_integers = st.integers(min_value=101, max_value=6000).map(lambda n: Literal("9" * n))
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([0, -1, 2**63 - 1, 2**63, 10**30, 24_000, 16_000]),
    st.floats(allow_nan=True, allow_infinity=True),
    huge_integers,
)
scalars = st.one_of(st.none(), st.booleans(), numbers, any_text, nasty_text)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3), max_leaves=8
)
field = st.one_of(scalars, json_values)


def _optional(strategy) -> st.SearchStrategy:
    """A value for one field of a generated object, or ``...`` to leave the field out."""
    return st.one_of(st.just(...), strategy)


def _object(**fields: st.SearchStrategy) -> st.SearchStrategy:
    return st.fixed_dictionaries({k: _optional(v) for k, v in fields.items()}).map(
        lambda d: {k: v for k, v in d.items() if v is not ...}
    )


def session_updates(persona_ids: st.SearchStrategy | None = None, voices: st.SearchStrategy | None = None):
    """``session.update`` events whose fields are valid, junk or nasty, at every level of nesting.

    ``persona_ids`` and ``voices`` add values that exist in the database, so lookups also find rows.
    """
    persona_ids = persona_ids if persona_ids is not None else st.nothing()
    voices = voices if voices is not None else st.nothing()
    fmt = _object(type=st.one_of(st.sampled_from([*p.INPUT_FORMATS, "audio/opus"]), field), rate=field)
    audio = _object(
        input=_object(format=st.one_of(fmt, field)),
        output=_object(format=st.one_of(fmt, field), voice=st.one_of(voices, field)),
    )
    duplex = _object(persona_id=st.one_of(persona_ids, field), record=field, binary_audio=field)
    session = _object(instructions=st.one_of(st.just("You are a pirate."), field), audio=audio, duplex=duplex)
    event = st.fixed_dictionaries(
        {"type": st.just("session.update"), "session": st.one_of(session, field)},
        optional={"event_id": st.one_of(st.just("evt-1"), field)},
    )
    return event


any_events = st.one_of(
    session_updates(),
    st.fixed_dictionaries(
        {"type": st.one_of(st.sampled_from(sorted(p.CLIENT_EVENT_TYPES)), field)},
        optional={"event_id": field, "audio": field, "image": field, "played_ms": field, "session": field},
    ),
    json_values,
)
frames = st.one_of(
    any_events.map(to_json),
    any_text,
    st.sampled_from(
        ["[" * 100_000, "{" * 5000, '{"type": "session.update"' * 2, '{"type":"playback.ack","played_ms":1e999}']
    ),
)


def _check_rejection(error: p.ProtocolError) -> None:
    assert error.code != "internal_error" and error.error_type == "invalid_request_error", (error.code, error.message)
    if error.param is not None:
        assert isinstance(error.param, str) and len(error.param) < 200


@settings(PROPERTY, max_examples=600)
@given(frame=frames)
def test_the_parser_and_the_format_validator_answer_every_frame_with_a_typed_result(frame):
    try:
        event = p.parse_client_event(frame)
    except p.ProtocolError as error:
        _check_rejection(error)
        return
    if isinstance(event, p.SessionUpdate):
        try:
            p.session_input_format(
                event.session, current=("audio/pcm", 24_000), input_rates=INPUT_RATES, output_rate=24_000
            )
        except p.ProtocolError as error:
            _check_rejection(error)


def test_the_two_reported_updates_are_typed_client_errors():
    """The cases that reached internal_error: a 5000-digit rate and a lone-surrogate voice."""
    rate = '{"type":"session.update","event_id":"e1","session":{"audio":{"input":{"format":{"type":"audio/pcm","rate":%s}}}}}'
    with pytest.raises(p.ProtocolError) as caught:
        p.parse_client_event(rate % ("9" * 5000))
    assert (caught.value.code, caught.value.param, caught.value.event_id) == (
        "invalid_value",
        "session.audio.input.format.rate",
        "e1",
    )
    with pytest.raises(p.ProtocolError) as caught:
        p.parse_client_event(to_json({"type": "session.update", "session": {"audio": {"output": {"voice": "\ud800"}}}}))
    assert (caught.value.code, caught.value.param) == ("invalid_value", "session.audio.output.voice")
    assert "surrogate" in caught.value.message


@pytest.mark.django_db
def test_whatever_the_parser_lets_through_the_lookups_answer(django_user_model):
    """Persona and voice lookups on the database never fail on a value the parser accepted."""
    user = django_user_model.objects.create_user(username="lookup", password="pw-for-tests-only")
    persona = Persona.objects.create(owner=user, name="mine", instructions="You are kind.")
    Voice.objects.create(owner=None, name="calm", status=Voice.Status.READY)
    known_ids = st.sampled_from([persona.pk, str(persona.pk), f"0{persona.pk}"])
    known_voices = st.sampled_from(["calm", "Calm", "calm ", "2"])

    @settings(PROPERTY, max_examples=250)
    @given(event=session_updates(known_ids, known_voices))
    def check(event):
        try:
            update = p.parse_client_event(to_json(event))
        except p.ProtocolError as error:
            _check_rejection(error)
            return
        duplex, audio = update.session.duplex, update.session.audio
        if duplex is not None and duplex.persona_id is not None:
            choice = services.persona_resolve(user=user, persona_id=duplex.persona_id)
            assert choice is None or choice.persona_id == persona.pk
        if audio is not None and audio.output is not None and audio.output.voice is not None:
            voice = services.voice_resolve(user=user, voice=audio.output.voice)
            assert voice is None or voice.name == "calm"

    check()


async def _answer(peer) -> dict:
    """The consumer's answer to one session.update: its error body, or the session.updated event."""
    while True:
        item = await peer.next(5.0)
        if isinstance(item, tuple):
            raise AssertionError(f"the socket closed ({item[1]}) after a bad event")
        if isinstance(item, dict) and item.get("type") in ("error", "session.updated"):
            return item


RESET = {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24_000}}}}}


@pytest.mark.django_db(transaction=True)
async def test_bad_session_updates_through_a_live_socket_leave_the_session_working(alice):
    await database_sync_to_async(Voice.objects.create)(owner=None, name="calm", status=Voice.Status.READY)
    peer, _ = await ready_peer(alice)
    await peer.prime()  # audio flows from here on: each example also checks that it still does
    answers: dict[str, int] = {}

    async def one_example(event):
        await peer.send_raw(text=to_json(event))
        answer = await _answer(peer)
        if answer["type"] == "error":
            error = answer["error"]
            assert error["code"] != "internal_error" and error["type"] == "invalid_request_error", error
            if event.get("event_id") == "evt-1":
                assert error["event_id"] == "evt-1"
            answers[error["code"]] = answers.get(error["code"], 0) + 1
        else:
            answers["session.updated"] = answers.get("session.updated", 0) + 1
        # The session goes on: it answers a valid update and its audio keeps coming.
        await peer.send(RESET)
        assert (await _answer(peer))["type"] == "session.updated"
        await peer.audio_frames(1)

    loop = asyncio.get_running_loop()

    # Hypothesis drives the examples from a thread; each one runs on this test's loop (the socket's).
    @settings(PROPERTY, max_examples=40)
    @given(event=session_updates(voices=st.just("calm")))
    def check(event):
        asyncio.run_coroutine_threadsafe(one_example(event), loop).result(timeout=60)

    await asyncio.to_thread(check)
    assert answers.get("invalid_value", 0) > 0 and sum(answers.values()) >= 40, answers
    await peer.send({"type": "session.update", "session": {"duplex": {"binary_audio": False}}})
    await peer.until("session.updated")
    await peer.proves_alive()
    await peer.close()


# Every event type but the one that ends the session on purpose, with junk in every field.
other_events = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(sorted(p.CLIENT_EVENT_TYPES - {"session.close"})), field)},
    optional={
        "event_id": st.one_of(st.just("evt-2"), field),
        "audio": st.one_of(st.sampled_from(["AAAA", "AAA=", "////", "\ud800"]), field),
        "image": field,
        "played_ms": field,
        "session": field,
    },
)
RESUME_AND_RESET = [{"type": "session.resume"}, RESET]


@pytest.mark.django_db(transaction=True)
async def test_every_event_type_with_bad_fields_through_a_live_socket_leaves_the_session_working(alice):
    """Whatever answers a bad event (an error, or none at all), it is never internal_error and the call goes on."""
    peer, _ = await ready_peer(alice)
    await peer.prime()
    codes: dict[str, int] = {}

    async def one_example(frame: str):
        await peer.comm.send_input({"type": "websocket.receive", "text": frame})  # send_to refuses "" itself
        for event in RESUME_AND_RESET:  # undo a valid pause or format change, then wait for the update's answer
            await peer.send(event)
        while (item := await peer.next(5.0)) is not None:
            if isinstance(item, tuple):
                raise AssertionError(f"the socket closed ({item[1]}) after {frame[:200]!r}")
            if isinstance(item, dict) and item["type"] == "error":
                error = item["error"]
                assert error["code"] != "internal_error" and error["type"] == "invalid_request_error", error
                codes[error["code"]] = codes.get(error["code"], 0) + 1
            if isinstance(item, dict) and item["type"] == "session.updated":
                break
        await peer.audio_frames(1)

    loop = asyncio.get_running_loop()

    @settings(PROPERTY, max_examples=40)
    @given(frame=st.one_of(other_events.map(to_json), any_text))
    def check(frame):
        asyncio.run_coroutine_threadsafe(one_example(frame), loop).result(timeout=60)

    await asyncio.to_thread(check)
    assert len(codes) >= 3, codes  # the generation reached several kinds of rejection
    await peer.send({"type": "session.update", "session": {"duplex": {"binary_audio": False}}})
    await peer.until("session.updated")
    await peer.proves_alive()
    await peer.close()
