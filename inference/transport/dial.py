"""Reaching a service: a connection that has passed the handshake, and the body of a one-shot reply.

Used by the one-shot calls (``inference.transport.client``) and by a web process's link
(``inference.transport.link``). An address is ``unix:///path``, a bare socket path, or ``tcp://host:port``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from inference.config import InferenceConfig
from inference.contracts import ParleyError
from inference.transport import auth, wire

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0  # connect + handshake: a hung host must not hold a caller forever


def not_running(address: str) -> ParleyError:
    # The address is for the operator's log; callers (and the pages that show this) get no server paths.
    logger.warning("inference.unreachable: nothing answers at %s", address)
    return ParleyError("the inference service is not running", code="internal_error", error_type="server_error")


def token() -> str | None:
    """This process's PARLEY_INFERENCE_TOKEN: every connection proves it holds it (and the service that it does)."""
    return InferenceConfig.from_env().inference_token


def service_closed() -> ParleyError:
    return ParleyError("the inference service closed the connection", code="internal_error", error_type="server_error")


def tcp_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``tcp://host:port`` address; None for a unix socket."""
    if not address.startswith("tcp://"):
        return None
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    return host.strip("[]"), int(port)


async def connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that has passed the service's handshake (inference/transport/auth.py)."""
    endpoint = tcp_endpoint(address)
    try:
        if endpoint is None:
            opening = asyncio.open_unix_connection(address.removeprefix("unix://"), limit=wire.MAX_FRAME_BYTES)
        else:
            opening = asyncio.open_connection(*endpoint, limit=wire.MAX_FRAME_BYTES)
        reader, writer = await asyncio.wait_for(opening, CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise not_running(address) from exc
    try:
        await asyncio.wait_for(auth.client_handshake(reader, writer, token(), peer=address), CONNECT_TIMEOUT_S)
    except TimeoutError as exc:
        writer.close()
        raise not_running(address) from exc
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def read_reply(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The JSON body of the service's reply to a call; an error reply raises its ``ParleyError``."""
    reply = await wire.read_frame(reader)
    if reply is None:
        raise service_closed()
    body = wire.parse_json(reply[1])
    if "error" in body:
        raise wire.error_from_dict(body["error"])
    return body
