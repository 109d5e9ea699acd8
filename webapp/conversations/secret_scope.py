"""A session opened with a client secret: the credential's subprotocol form and the secret's fixed fields.

Browsers cannot set headers on a WebSocket, so OpenAI's browser SDKs send the credential as a
subprotocol: ``Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.<secret>, ...``. Chromium fails
the handshake unless the server selects one of the offered subprotocols, so ``realtime`` is selected.

The session configuration a secret was minted with is applied when its session opens; afterwards a
``session.update`` may repeat the fields it names but not change them (``client_secret_scope``), so a page
holding the secret cannot widen what the app's server granted: another persona, voice, mode, recording
choice or turn detection. Formats and fields the secret leaves open stay the client's to choose.
"""

from __future__ import annotations

from typing import Any

from webapp.conversations import protocol as p

CREDENTIAL_SUBPROTOCOL = "openai-insecure-api-key."
SELECTED_SUBPROTOCOL = "realtime"

# (path in the session configuration, as the client names it) of the fields a secret fixes when it names them.
FIXED_FIELDS: tuple[tuple[str, ...], ...] = (
    ("instructions",),
    ("duplex", "persona_id"),
    ("duplex", "mode"),
    ("duplex", "record"),
    ("duplex", "max_response_s"),
    ("audio", "output", "voice"),
    ("audio", "input", "turn_detection"),
)


def subprotocol_credential(scope: dict) -> str | None:
    """The credential a browser sent as ``openai-insecure-api-key.<credential>``, or None."""
    for protocol in scope.get("subprotocols") or ():
        if protocol.startswith(CREDENTIAL_SUBPROTOCOL):
            return protocol[len(CREDENTIAL_SUBPROTOCOL) :].strip() or None
    return None


def selected_subprotocol(scope: dict) -> str | None:
    """``realtime`` when the client offered it (OpenAI's browser form), else None (no subprotocol)."""
    return SELECTED_SUBPROTOCOL if SELECTED_SUBPROTOCOL in (scope.get("subprotocols") or ()) else None


def _named(config: dict[str, Any], path: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = config
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def check_update(granted: p.SessionConfig, update: p.SessionConfig, *, current_instructions: str | None) -> None:
    """Refuse an update that changes a field the secret fixed (the whole update is then refused)."""
    fixed = granted.model_dump(mode="json", exclude_unset=True)
    asked = update.model_dump(mode="json", exclude_unset=True)
    for path in FIXED_FIELDS:
        has_fixed, fixed_value = _named(fixed, path)
        has_asked, asked_value = _named(asked, path)
        if has_fixed and has_asked and asked_value != fixed_value:
            name = "session." + ".".join(path)
            raise p.ProtocolError(
                "client_secret_scope",
                f"{name} is fixed by the client secret this session was opened with.",
                param=name,
                error_type="invalid_request_error",
            )
    persona_fixed = _named(fixed, ("duplex", "persona_id"))[0]
    new_text = "instructions" in asked and asked["instructions"] != current_instructions
    if persona_fixed and new_text and not _named(asked, ("duplex", "persona_id"))[0]:
        # New instructions without the persona would replace the secret's persona with free text.
        raise p.ProtocolError(
            "client_secret_scope",
            "session.instructions cannot replace the persona fixed by this session's client secret.",
            param="session.instructions",
        )
