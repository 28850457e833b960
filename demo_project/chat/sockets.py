"""The chat of the AI SDK page over one WebSocket (``ws/ai/chat/``): ai 7's
``WebSocketChatTransport`` served by ``pgstreams.aisdk_ws``. A send frame starts the prompt's
turn as the HTTP endpoints do (``assistant.new_turn``: a ``Conversation`` and its answer, a
generation); a resume frame replays the chat's latest answer, finished or not."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.urls import path

from pgstreams import aisdk_ws

from .assistant import CHAT_ID, checked_prompt, latest_turn, new_turn


class ChatSocket(aisdk_ws.ChatConsumer):
    async def start_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        user = self.signed_in()
        try:
            prompt = checked_prompt(request.chat_id, request.messages)
        except ValueError as exc:
            raise aisdk_ws.RequestRefused(str(exc)) from None
        return (await sync_to_async(new_turn)(user, request.chat_id, prompt)).stream_id

    async def latest_answer(self, request: aisdk_ws.ChatRequest) -> Any:
        user = self.signed_in()
        if not CHAT_ID.fullmatch(request.chat_id):
            return None  # no chat has such an id
        turn = await latest_turn(user, request.chat_id)
        return None if turn is None else turn.stream_id

    def signed_in(self) -> Any:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            raise aisdk_ws.RequestRefused("sign in to chat")
        return user


websocket_urlpatterns = [path("ws/ai/chat/", ChatSocket.as_asgi(), name="ai-chat-ws")]
