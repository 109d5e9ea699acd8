"""Registry records signed with the shared secret, so that write access to Redis is not enough to pose as a service.

A service's heartbeat record (``parley:services`` in ``inference.cluster.registry``) tells every web process
where to dial and how much room there is. Anyone who can write to Redis could otherwise add a record
with many free slots pointing at their own listener. So each record carries ``signature``: an
HMAC-SHA256 under ``PARLEY_INFERENCE_TOKEN`` over every other field, ``heartbeat_at`` included (the
timestamp: a replayed old record reads as down, as any stale one does). Readers use a record only
when its signature matches and it is filed under the ``service_id`` it names; anything else is
``ForgedRecord``: ``genuine`` leaves it out and ``ForgeryLog`` logs it (``registry.forged_record``)
once per distinct content, since the web tier reads the registry several times a second.

The signed bytes are the record's canonical JSON (sorted keys, no spaces) after a JSON round trip,
so the writer and every reader sign exactly the same text whatever Python types the writer held.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import Any

logger = logging.getLogger(__name__)

SIGNATURE = "signature"
LABEL = b"parley-registry-record-v1\x00"  # what this MAC is for: never valid as a handshake proof


class ForgedRecord(ValueError):
    """A registry record that cannot be trusted; the message says why (for the log)."""


def sign(record: dict[str, Any], secret: str) -> dict[str, Any]:
    """``record`` (a JSON-able dict) with its ``signature``."""
    body = json.loads(json.dumps({k: v for k, v in record.items() if k != SIGNATURE}))
    return {**body, SIGNATURE: _mac(body, secret)}


def verified(field: str, raw: bytes | str, secret: str) -> dict[str, Any]:
    """The record stored under ``field``, signature removed; ``ForgedRecord`` when it is not genuine."""
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ForgedRecord(f"not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ForgedRecord("not a JSON object")
    given = record.pop(SIGNATURE, None)
    if given is None:
        raise ForgedRecord("unsigned")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), _mac(record, secret).encode()):
        raise ForgedRecord("the signature does not match: not written by a holder of the shared secret, or altered")
    if record.get("service_id") != field:
        raise ForgedRecord(f"names service {str(record.get('service_id'))[:60]!r}")
    return record


def _mac(body: dict[str, Any], secret: str) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret.encode(), LABEL + canonical, hashlib.sha256).hexdigest()


class ForgeryLog:
    """Logs each forged record once per distinct content (a reader runs several times a second)."""

    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    def report(self, name: str, value: bytes, exc: ForgedRecord) -> None:
        digest = hashlib.sha256(name.encode() + b"\x00" + value).digest()
        if digest in self._seen:
            return
        if len(self._seen) > 1000:  # an attacker rewriting records must not grow this without bound
            self._seen.clear()
        self._seen.add(digest)
        logger.warning(
            "registry.forged_record: ignored %r (%s); it is never dialled",
            name[:80],
            exc,
            extra={"service_id": name[:80], "detail": str(exc)},
        )


def genuine(raw: dict, secret: str, forgeries: ForgeryLog) -> dict[str, dict[str, Any]]:
    """service_id -> record, for the records of ``raw`` (an HGETALL) that carry a valid signature."""
    records = {}
    for field, value in raw.items():
        name = field.decode(errors="replace") if isinstance(field, bytes) else field
        try:
            records[name] = verified(name, value, secret)
        except ForgedRecord as exc:
            forgeries.report(name, value, exc)
    return records
