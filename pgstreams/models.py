"""Tables: ``Stream`` (one row per stream, holding its offset counter), ``Chunk`` (one row per
written piece) and ``ProducerState`` (what an idempotent producer last wrote to a stream). No
notification or read logic lives here.

Streams belong to their owner: deleting a user deletes the user's streams. A stream may also have
a path, its name at the Durable Streams endpoint, with the attributes that protocol gives it
(content type, expiry, fork parentage); a stream without one is reached by its id alone.

``Chunk``'s primary key is (stream, offset): the one index that both enforces gap-free, unique
offsets and serves every read. Deleting a stream deletes its chunks in the database (a trigger
the migrations add, not a foreign key, which would check every chunk written: migration 0006), so
Django never loads chunks to delete them.
"""

from __future__ import annotations

import re
from typing import Final

from django.conf import settings
from django.db import models
from django.db.models import Q

from .partitions import new_stream_id

# The longest path a stream may have, in characters.
MAX_PATH: Final = 512


# Characters a path may not hold: controls (they would reach logs and headers) and backslash.
_BAD_PATH = re.compile(r"[\x00-\x1f\x7f\\]")


def path_problem(path: str) -> str | None:
    """What is wrong with a stream path, or None: it has 1 to MAX_PATH characters, no control
    character or backslash, and no empty, ``.`` or ``..`` segment; ``__ds/...`` is reserved by
    the Durable Streams protocol."""
    if not path or len(path) > MAX_PATH:
        return f"a stream path has 1 to {MAX_PATH} characters"
    if _BAD_PATH.search(path):
        return "a stream path may not hold control characters or backslashes"
    segments = path.split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        return "a stream path may not have empty, '.' or '..' segments"
    if segments[0] == "__ds":
        return "paths under __ds/ are reserved by the Durable Streams protocol"
    return None


def media_type(content_type: str) -> str:
    """A Content-Type's media type, without parameters, in lower case: what two types must share
    to match."""
    return content_type.split(";", 1)[0].strip().lower()


def is_text(content_type: str) -> bool:
    """Whether streams of this type hold text: ``text/*`` and ``application/json``, the types the
    Durable Streams protocol sends as text over SSE."""
    kind = media_type(content_type)
    return kind.startswith("text/") or kind == "application/json"


class Stream(models.Model):
    id = models.UUIDField(primary_key=True, default=new_stream_id, editable=False)
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
    path = models.CharField(
        max_length=MAX_PATH,
        null=True,
        blank=True,
        editable=False,
        help_text="Its name at the Durable Streams endpoint (v1/stream/<path>); unique.",
    )
    content_type = models.CharField(
        max_length=255,
        default="text/plain",
        db_default="text/plain",  # and for rows inserted by SQL of a project's own
        editable=False,
        help_text="text/* and application/json streams hold text; any other type, bytes.",
    )
    ttl = models.PositiveIntegerField(
        null=True, blank=True, editable=False, help_text="Seconds without a read or write after which it expires."
    )
    expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    used_at = models.DateTimeField(null=True, blank=True, editable=False, help_text="Last read or write, for ttl.")
    writer_seq = models.TextField(
        blank=True, default="", db_default="", editable=False, help_text="The last Stream-Seq appended."
    )
    forked_from = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        editable=False,
        on_delete=models.SET_NULL,
        related_name="forks",
        # The migration adds the constraint with ON DELETE SET NULL (forks own their chunks), and
        # the partial index below.
        db_constraint=False,
        db_index=False,
    )
    fork_offset = models.BigIntegerField(null=True, blank=True, editable=False)
    fork_sub_offset = models.BigIntegerField(default=0, db_default=0, editable=False)
    deleted_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Deleted while forks of it remained: its path stays taken."
    )
    compacted_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When its chunks were folded into runs (compaction)."
    )

    class Meta:
        db_table = "pgstreams_stream"
        ordering = ["-created_at"]
        indexes = [
            # Pruning takes the oldest closed streams first.
            models.Index(
                fields=["closed_at", "id"], name="pgstreams_stream_closed", condition=Q(closed_at__isnull=False)
            ),
            # Processes look for open generations whose writer's lease ran out (generations.py).
            models.Index(
                fields=["id"],
                name="pgstreams_stream_generating",
                condition=Q(closed_at__isnull=True) & Q(metadata__has_key="pgstreams_generation"),
            ),
            # A delete asks whether the stream has forks; few streams are forks.
            models.Index(fields=["forked_from"], name="pgstreams_stream_forks", condition=Q(forked_from__isnull=False)),
            # Pruning looks for expired streams and for tombstones; few streams are either.
            models.Index(
                fields=["id"],
                name="pgstreams_stream_expiring",
                condition=Q(deleted_at__isnull=True) & (Q(ttl__isnull=False) | Q(expires_at__isnull=False)),
            ),
            models.Index(fields=["id"], name="pgstreams_stream_tombstones", condition=Q(deleted_at__isnull=False)),
            # Compaction takes the closed streams not compacted yet, the oldest first.
            models.Index(
                fields=["closed_at"],
                name="pgstreams_stream_compactable",
                condition=Q(closed_at__isnull=False) & Q(compacted_at__isnull=True),
            ),
        ]
        constraints = [
            # Built without blocking writers by migration 0003.
            models.UniqueConstraint(fields=["path"], condition=Q(path__isnull=False), name="pgstreams_stream_path"),
        ]

    def __str__(self) -> str:
        return self.label or str(self.id)

    @property
    def is_closed(self) -> bool:
        return self.closed_at is not None

    @property
    def holds_text(self) -> bool:
        """Whether its chunks are text (``data``) rather than bytes (``blob``)."""
        return is_text(self.content_type)


class Chunk(models.Model):
    pk = models.CompositePrimaryKey("stream", "offset")
    # Declared without a constraint: a trigger deletes a stream's chunks with it (migration 0006),
    # and the primary key's leading column already indexes stream_id.
    stream = models.ForeignKey(
        Stream,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="chunks",
    )
    offset = models.BigIntegerField()
    data = models.TextField(null=True, help_text="The chunk of a text stream.")
    blob = models.BinaryField(null=True, help_text="The chunk of a bytes stream.")
    created_at = models.DateTimeField()
    run = models.BinaryField(
        null=True,
        editable=False,
        help_text="A run's index (runs.py): the row holds that many chunks, up to its offset. NULL: one chunk.",
    )

    class Meta:
        db_table = "pgstreams_chunk"
        ordering = ["stream", "offset"]

    def __str__(self) -> str:
        return f"{self.stream_id}@{self.offset}"


class ProducerState(models.Model):
    """An idempotent producer's place in one stream: the epoch it writes in and the last batch
    (seq) it committed, updated in the transaction of the append it guards."""

    pk = models.CompositePrimaryKey("stream", "producer_id")
    # A migration adds the constraint, with ON DELETE CASCADE (a producer's state is written
    # rarely: its check costs little).
    stream = models.ForeignKey(
        Stream, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="producers"
    )
    producer_id = models.TextField()
    epoch = models.BigIntegerField()
    seq = models.BigIntegerField()

    class Meta:
        db_table = "pgstreams_producer"

    def __str__(self) -> str:
        return f"{self.producer_id}@{self.stream_id} epoch {self.epoch} seq {self.seq}"
