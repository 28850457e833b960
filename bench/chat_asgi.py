"""The demo's application with a chat socket for the fan-out benchmark's ``aisdk-ws`` subscribers
(``ws/bench/chat/``): ai 7's ``WebSocketChatTransport`` frames, served by
``pgstreams.aisdk_ws.ChatConsumer``, whose resume of chat <id> replays stream <id>. The
benchmark's streams have no owner, so anyone may read them; the demo's own chat socket finds a
chat's latest answer among its user's conversations (one query per resume, at connect), and this
one takes the id as it is: what is measured is the consumer's delivery. It starts no answer."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.urls import path

from demo_project import asgi as demo
from pgstreams import aisdk_ws
from pgstreams.origin import CsrfOriginValidator
from pgstreams.routing import websocket_urlpatterns


class BenchChats(aisdk_ws.ChatConsumer):
    async def start_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        raise aisdk_ws.RequestRefused("the benchmark's chat socket only resumes")

    async def latest_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        return request.chat_id


chats = [path("ws/bench/chat/", BenchChats.as_asgi())]
application = ProtocolTypeRouter(
    {
        "http": demo.application,
        "websocket": CsrfOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns + chats))),
    }
)
