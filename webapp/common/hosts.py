"""A plain 400 for a request whose Host is not in ALLOWED_HOSTS, before any other middleware runs.

Django raises ``DisallowedHost`` for such a request; with DEBUG on (``make run``) it answers with its
technical page (traceback, request, settings). A page on another site can reach a loopback server
through DNS rebinding (its own host name resolving to 127.0.0.1), so the answer must say nothing.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest


def _refusal(request: HttpRequest) -> HttpResponse | None:
    try:
        request.get_host()
    except DisallowedHost:
        return HttpResponseBadRequest("Unknown host.", content_type="text/plain")
    return None


class KnownHostMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self._acall(request)
        return _refusal(request) or self.get_response(request)

    async def _acall(self, request: HttpRequest):
        return _refusal(request) or await self.get_response(request)
