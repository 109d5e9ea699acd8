"""Cross-origin calls to ``/v1/realtime/calls`` from pages of other sites (OpenAI's browser SDKs).

A browser app posts its SDP offer with a client secret in ``Authorization``; that header and
``Content-Type: application/sdp`` make the browser ask first (a preflight ``OPTIONS``). Answered for
any origin, without ``Access-Control-Allow-Credentials``: a cross-origin request then carries no
cookie, so only the bearer credential it sends can authenticate it, never the caller's session.
The mint endpoint (``/v1/realtime/client_secrets``) gets none of this: it takes a long-lived API key,
which belongs on the app's server, not in a page.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

CORS_PATHS = ("/v1/realtime/calls",)
ALLOWED_HEADERS = "Authorization, Content-Type, X-OpenAI-Agents-SDK, OpenAI-Beta"
PREFLIGHT_MAX_AGE_S = 600


def _applies(request: HttpRequest) -> bool:
    return "Origin" in request.headers and request.path.startswith(CORS_PATHS)


def _preflight(request: HttpRequest) -> HttpResponse | None:
    if request.method != "OPTIONS" or not _applies(request):
        return None
    response = HttpResponse(status=204)
    response["Access-Control-Allow-Methods"] = "POST, DELETE"
    response["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
    response["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
    return _allow(request, response)


def _allow(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if _applies(request):
        response["Access-Control-Allow-Origin"] = "*"
        response["Access-Control-Expose-Headers"] = "Location"  # the SDK reads the call id from it
    return response


@sync_and_async_middleware
def realtime_cors(get_response):
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponse:
            return _preflight(request) or _allow(request, await get_response(request))

    else:

        def middleware(request: HttpRequest) -> HttpResponse:
            return _preflight(request) or _allow(request, get_response(request))

    return middleware
