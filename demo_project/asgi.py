"""ASGI entry point of the demo site: HTTP (with static files, and pgstreams' Durable Streams
endpoint straight to its view), pgstreams' WebSocket routes and the AI SDK page's chat socket,
behind an Origin check as strict as Django's CSRF check (scheme, host and port). The objects
loaded at start are frozen out of the garbage collector (docs/howto/deploy.md)."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from demo_project.chat import sockets  # noqa: E402
from pgstreams.durable.asgi import DurableStreamsFirst  # noqa: E402
from pgstreams.origin import CsrfOriginValidator  # noqa: E402
from pgstreams.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The Durable Streams endpoint's requests skip the middleware chain (README, Durable Streams).
        "http": DurableStreamsFirst(ASGIStaticFilesHandler(django_application)),
        "websocket": CsrfOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns + sockets.websocket_urlpatterns))
        ),
    }
)

# Everything loaded so far lives as long as the process: the collector's full passes need not walk
# it again (they set the tail of an append's latency: BENCHMARKS, "The collector's full passes").
gc.collect()
gc.freeze()
