"""The Django admin for streams: a list that stays fast on large tables (no per-row query, no
COUNT, no chunks loaded), and a page per stream with its text, its chunks a page at a time and,
while it is open, a live tail. Chunks themselves are not editable; streams are created by code,
and deleted as a Durable Streams DELETE deletes them (a tombstone while forks remain)."""

from __future__ import annotations

import sys
from typing import Any

from django.contrib import admin, messages
from django.db import connections
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse

import pgstreams

from . import conf, runs
from .auth import may_view_all
from .durable.store import remove
from .models import Chunk, Stream

PREVIEW_BYTES = 64 * 1024
PREVIEW_CHUNKS = 10_000
CHUNKS_PER_PAGE = 50


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("open", "Open"), ("closed", "Closed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Stream]) -> QuerySet[Stream]:
        if self.value() == "open":
            return queryset.filter(closed_at__isnull=True)
        if self.value() == "closed":
            return queryset.filter(closed_at__isnull=False)
        return queryset


@admin.register(Stream)
class StreamAdmin(admin.ModelAdmin):
    list_display = ("id", "label", "path", "owner", "state", "chunk_count", "created_at", "last_write")
    list_filter = (StateFilter, "created_at", "closed_at")
    search_fields = ("id", "label", "path", "owner__username")
    list_select_related = ("owner",)
    ordering = ("-created_at",)
    date_hierarchy = "created_at"
    show_full_result_count = False  # no second COUNT(*) over the whole table
    actions = ["close_streams", "delete_selected"]
    readonly_fields = (
        "id",
        "state",
        "owner",
        "label",
        "created_at",
        "closed_at",
        "next_offset",
        "metadata",
        "path",
        "content_type",
        "ttl",
        "expires_at",
        "forked_from",
        "deleted_at",
    )
    fields = readonly_fields
    change_form_template = "admin/pgstreams/stream/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Stream]:
        # The time of the last chunk, from the primary key's last entry: part of the list's one query.
        last = Chunk.objects.filter(stream=OuterRef("pk")).order_by("-offset").values("created_at")[:1]
        return super().get_queryset(request).annotate(last_write_at=Subquery(last))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Stream | None = None) -> bool:
        # The rule the WebSocket and SSE endpoints apply to other users' streams (the live tail).
        return may_view_all(request.user)

    def has_delete_permission(self, request: HttpRequest, obj: Stream | None = None) -> bool:
        # Its delete page shows what it is deleting: only to those who may read it.
        return may_view_all(request.user) and super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: Stream) -> None:
        """Django's delete (the project's objects that point at the stream go as its delete page
        said), but for a stream forks were made of: that stays as a tombstone that keeps its
        path until its last fork goes, as after a Durable Streams DELETE."""
        alias = obj._state.db or conf.database()
        if Stream.objects.using(alias).filter(forked_from=obj.pk).exists():
            remove(alias, obj.pk)
        else:
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Stream]) -> None:
        forked = set(
            Stream.objects.using(queryset.db).filter(forked_from__in=queryset).values_list("forked_from", flat=True)
        )
        for stream_id in forked:
            remove(queryset.db, stream_id)
        super().delete_queryset(request, queryset.exclude(pk__in=forked))

    @admin.display(description="state", ordering="closed_at")
    def state(self, obj: Stream) -> str:
        return "closed" if obj.closed_at else "open"

    @admin.display(description="chunks", ordering="next_offset")
    def chunk_count(self, obj: Stream) -> int:
        return obj.next_offset

    @admin.display(description="last write", ordering="last_write_at")
    def last_write(self, obj: Stream) -> Any:
        return getattr(obj, "last_write_at", None)

    @admin.action(description="Close the selected streams", permissions=["change"])
    def close_streams(self, request: HttpRequest, queryset: QuerySet[Stream]) -> None:
        closed = 0
        for stream_id in queryset.filter(closed_at__isnull=True).values_list("pk", flat=True):
            try:
                pgstreams.close(stream_id, using=queryset.db)
                closed += 1
            except pgstreams.StreamClosed:  # closed meanwhile
                pass
        self.message_user(request, f"Closed {closed} stream(s).", messages.SUCCESS)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        stream = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if stream is not None:
            context.update(self._contents(request, stream))
        return super().change_view(request, object_id, form_url, extra_context=context)

    def _contents(self, request: HttpRequest, stream: Stream) -> dict[str, Any]:
        """The text preview, one page of chunks (offsets are gap-free: pages need no COUNT)."""
        pages = max(1, -(-stream.next_offset // CHUNKS_PER_PAGE))
        try:
            page = min(max(1, int(request.GET.get("chunks_page", "1"))), pages)
        except ValueError:
            page = 1
        first = (page - 1) * CHUNKS_PER_PAGE
        return {
            "preview": _preview(stream),
            "chunks": _page(stream, first),
            "chunks_page": page,
            "chunks_pages": pages,
            "chunks_previous": page - 1 if page > 1 else None,
            "chunks_next": page + 1 if page < pages else None,
            "live_tail": stream.closed_at is None and stream.holds_text,
            "stream": stream,
            "show_save": False,  # every field is read-only
            "show_save_and_continue": False,
        }


# Rows from an offset, the one a run holds it in first (runs.py), as many as a page of chunks may
# take (a row holds one chunk at least).
_ROWS_SQL = (
    'SELECT "offset", data, blob, run, created_at FROM pgstreams_chunk'
    ' WHERE stream_id = %s AND "offset" >= %s ORDER BY "offset" LIMIT %s'
)
# The chunks whose text starts within the first %(limit)s bytes, in one query however many of
# them are empty; octet_length reads a value's size from its header, without detoasting it. A
# run (runs.py) counts whole, as the chunks before its own do; runs.take cuts inside it.
_PREVIEW_SQL = """
SELECT "offset", data, run FROM (
    SELECT "offset", data, run, sum(octet_length(data)) OVER (ORDER BY "offset") - octet_length(data) AS before
    FROM pgstreams_chunk WHERE stream_id = %(stream)s ORDER BY "offset" LIMIT %(chunks)s
) AS c
WHERE before < %(limit)s ORDER BY "offset"
"""


def _page(stream: Stream, first: int) -> list[tuple[int, str | None, int | None, Any]]:
    """A page of chunks from offset ``first``: offset, text (or None), bytes (of a blob), time."""
    with connections[stream._state.db or conf.database()].cursor() as cursor:
        cursor.execute(_ROWS_SQL, [stream.id, first, CHUNKS_PER_PAGE])
        rows = cursor.fetchall()
    held = ((offset, data if data is not None else blob, run, at) for offset, data, blob, run, at in rows)
    values, times, _ = runs.take(held, first, CHUNKS_PER_PAGE, sys.maxsize)
    return [
        (first + i, value, None, at) if isinstance(value, str) else (first + i, None, len(value), at)
        for i, (value, at) in enumerate(zip(values, times, strict=True))
    ]


def _preview(stream: Stream) -> dict[str, Any]:
    """The stream's text from the start: up to PREVIEW_BYTES of UTF-8 from at most
    PREVIEW_CHUNKS chunks, in one query (none for a stream of bytes)."""
    if not stream.holds_text:
        return {"text": f"({stream.content_type}: bytes, listed by chunk below)", "cut": False}
    params = {"stream": stream.id, "chunks": PREVIEW_CHUNKS, "limit": PREVIEW_BYTES}
    with connections[stream._state.db or conf.database()].cursor() as cursor:
        cursor.execute(_PREVIEW_SQL, params)
        rows = [(offset, data, run, None) for offset, data, run in cursor.fetchall()]
    first = rows[0][0] - (runs.count(rows[0][2]) - 1 if rows[0][2] is not None else 0) if rows else 0
    parts = runs.take(rows, first, PREVIEW_CHUNKS, PREVIEW_BYTES)[0]  # from the first chunk held
    encoded = "".join(parts).encode()  # type: ignore[arg-type]
    return {
        "text": encoded[:PREVIEW_BYTES].decode(errors="ignore"),
        "cut": len(encoded) > PREVIEW_BYTES or len(parts) < stream.next_offset,
        "limit_kib": PREVIEW_BYTES // 1024,
        "limit_chunks": f"{PREVIEW_CHUNKS:,}",
    }
