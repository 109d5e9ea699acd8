"""ASGI entry point: the server's own send kept for the socket lane, the client's address from trusted proxies
only, then HTTP -> Django; WebSocket -> origin policy -> the process's own load (a realtime connect while it is
busy goes straight to the consumer, which says so) -> cookie auth -> API-key auth -> connect limits -> routes."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")
django_asgi_app = get_asgi_application()  # before importing anything that touches models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from webapp.calls.warm_start import begin_warm_start  # noqa: E402
from webapp.common.forwarded import TrustedProxyMiddleware  # noqa: E402
from webapp.common.loop_load import LoopLoadMiddleware  # noqa: E402
from webapp.conversations.auth import (  # noqa: E402
    BearerKeyAuthMiddleware,
    ConnectLimitMiddleware,
    OriginPolicyMiddleware,
)
from webapp.conversations.routing import REALTIME_PATHS, websocket_urlpatterns  # noqa: E402
from webapp.conversations.socket_lane import ServerSendMiddleware  # noqa: E402
from webapp.operations.routing import websocket_urlpatterns as operations_websockets  # noqa: E402

# make run serves plain daphne: with DEBUG on, static files come from the app itself (as runserver
# does); production serves STATIC_ROOT from the front proxy.
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app

# The engine loads and the call page's default start is prepared in the background while the server starts.
begin_warm_start()

# The realtime endpoint (/v1/realtime) and the operations console's socket (/ops/live).
websocket_routes = URLRouter([*websocket_urlpatterns, *operations_websockets])

application = ServerSendMiddleware(
    TrustedProxyMiddleware(
        ProtocolTypeRouter(
            {
                "http": http_app,
                "websocket": OriginPolicyMiddleware(
                    LoopLoadMiddleware(
                        AuthMiddlewareStack(BearerKeyAuthMiddleware(ConnectLimitMiddleware(websocket_routes))),
                        busy_app=websocket_routes,  # refused before any credential is looked up
                        paths=REALTIME_PATHS,
                    )
                ),
            }
        )
    )
)

# Django, channels and every module imported above live as long as the process: frozen out of the garbage
# collector's full passes, which otherwise walk them all, a pause in the loop that carries the callers' frames.
# (The engine's own start-up objects are frozen when it has started: inference.service.)
gc.freeze()
