"""Tables: ``Stream`` (one row per stream, holding its offset counter) and ``Chunk`` (one row per
written piece). No notification or read logic lives here.

Streams belong to their owner: deleting a user deletes the user's streams.

``Chunk``'s primary key is (stream, offset): the one index that both enforces gap-free, unique
offsets and serves every read. Deleting a stream deletes its chunks in the database
(``ON DELETE CASCADE``, added by the migration), so Django never loads chunks to delete them.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class Stream(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    next_offset = models.BigIntegerField(default=0, editable=False, help_text="How many chunks have been written.")
    label = models.CharField(max_length=200, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        # A user's streams go with the user: a stream left without an owner would be readable
        # by anyone with its id.
        on_delete=models.CASCADE,
        related_name="pgstreams",
    )
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "pgstreams_stream"
        ordering = ["-created_at"]
        indexes = [
            # Pruning takes the oldest closed streams first.
            models.Index(
                fields=["closed_at", "id"], name="pgstreams_stream_closed", condition=Q(closed_at__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return self.label or str(self.id)

    @property
    def is_closed(self) -> bool:
        return self.closed_at is not None


class Chunk(models.Model):
    pk = models.CompositePrimaryKey("stream", "offset")
    # The foreign key is declared without a Django-made constraint: the migration adds one with
    # ON DELETE CASCADE, and the primary key's leading column already indexes stream_id.
    stream = models.ForeignKey(
        Stream,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="chunks",
    )
    offset = models.BigIntegerField()
    data = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "pgstreams_chunk"
        ordering = ["stream", "offset"]

    def __str__(self) -> str:
        return f"{self.stream_id}@{self.offset}"
