"""The ``SessionHandle`` calls that take no arguments, written once for both handles.

``inference.session.local_handle.LocalHandle`` (in process) and ``inference.transport.client.RemoteSessionHandle``
(over the service socket) forward each of them the same way, by its name, and the socket server dispatches
the same names (``NO_ARGUMENT_CALLS``). What each call does is ``inference.api.SessionHandle``'s contract.
"""

from __future__ import annotations

import abc

NO_ARGUMENT_CALLS = ("pause", "resume", "cancel", "force_listen", "commit_input", "clear_input", "create_response")


class NoArgumentCalls(abc.ABC):
    """``pause`` ... ``create_response``, each forwarded by name to ``_forward``."""

    @abc.abstractmethod
    async def _forward(self, name: str) -> None:
        """Make the call ``name`` (one of ``NO_ARGUMENT_CALLS``) on the session."""

    async def pause(self) -> None:
        await self._forward("pause")

    async def resume(self) -> None:
        await self._forward("resume")

    async def cancel(self) -> None:
        await self._forward("cancel")

    async def force_listen(self) -> None:
        await self._forward("force_listen")

    async def commit_input(self) -> None:
        await self._forward("commit_input")

    async def clear_input(self) -> None:
        await self._forward("clear_input")

    async def create_response(self) -> None:
        await self._forward("create_response")
