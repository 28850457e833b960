"""A conversation turn: a user's prompt and the stream its answer is written to; the turns of an
AI SDK chat share its ``chat_id`` (the id ``useChat`` gives the chat)."""

from django.conf import settings
from django.db import models

from pgstreams.models import Stream


class Conversation(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    prompt = models.TextField(max_length=2000)
    stream = models.OneToOneField(Stream, on_delete=models.CASCADE, related_name="conversation")
    created_at = models.DateTimeField(auto_now_add=True)
    chat_id = models.CharField(max_length=64, null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.prompt[:60]
