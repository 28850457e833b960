"""The write API against a real Postgres: offsets, transactions, validation and errors."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.test import override_settings

import pgstreams
from pgstreams import conf, db
from pgstreams.models import Chunk, Stream
from tests.helpers import PARTITIONED

pytestmark = pytest.mark.django_db(transaction=True)


def stored(stream: Stream) -> list[tuple[int, str]]:
    return list(Chunk.objects.filter(stream=stream).order_by("offset").values_list("offset", "data"))


def test_create_stream_defaults_and_fields() -> None:
    owner = get_user_model().objects.create_user("ada")
    s = pgstreams.create_stream(owner=owner, label="answer", metadata={"model": "fake"})
    s.refresh_from_db()
    assert isinstance(s.id, uuid.UUID) and s.id.version == (7 if PARTITIONED else 4)  # random, or time-ordered
    assert (s.owner, s.label, s.metadata, s.next_offset, s.closed_at) == (owner, "answer", {"model": "fake"}, 0, None)
    assert pgstreams.create_stream().metadata == {}


@pytest.mark.parametrize(
    "fields",
    [
        {"label": "a\x00b"},
        {"label": "\ud800"},
        {"path": "a\ud800b"},
        {"metadata": {"k": "a\x00b"}},
        {"metadata": {"\x00": 1}},
    ],
    ids=["label NUL", "label surrogate", "path surrogate", "metadata NUL", "metadata key NUL"],
)
def test_text_postgres_cannot_store_is_refused_by_create_stream_and_nothing_is_made(fields) -> None:
    """It was a DataError or a UnicodeEncodeError from the database driver (the demo's label is
    the prompt's start: a 500)."""
    before = Stream.objects.count()
    with pytest.raises(ValueError, match="which Postgres cannot store"):
        pgstreams.create_stream(**fields)
    assert Stream.objects.count() == before


def test_write_returns_gap_free_offsets_and_counts() -> None:
    s = pgstreams.create_stream()
    assert [pgstreams.write(s.id, f"t{i}") for i in range(3)] == [0, 1, 2]
    assert pgstreams.write_many(str(s.id), ["a", "b"]) == [3, 4]
    assert pgstreams.write_many(s, []) == []
    assert stored(s) == [(0, "t0"), (1, "t1"), (2, "t2"), (3, "a"), (4, "b")]
    s.refresh_from_db()
    assert s.next_offset == 5


def test_write_is_one_statement(django_assert_num_queries) -> None:
    s = pgstreams.create_stream()
    with django_assert_num_queries(1):
        pgstreams.write(s.id, "x")
    with django_assert_num_queries(1):
        pgstreams.write_many(s.id, ["y", "z"])


def test_rollback_leaves_no_gap_and_nothing_visible() -> None:
    s = pgstreams.create_stream()
    pgstreams.write(s.id, "kept")
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            assert pgstreams.write(s.id, "lost") == 1
            raise RuntimeError
    assert pgstreams.write(s.id, "next") == 1
    assert stored(s) == [(0, "kept"), (1, "next")]


def test_write_in_atomic_is_invisible_to_other_connections_until_commit() -> None:
    s = pgstreams.create_stream()
    with transaction.atomic():
        pgstreams.write(s.id, "pending")
        # Another connection (the listener's fetch path) must not see it yet.
        page = _page_from_other_connection(s.id)
        assert page == (0, [])
    assert _page_from_other_connection(s.id) == (1, ["pending"])


def _page_from_other_connection(stream_id: uuid.UUID) -> tuple[int, list[str]]:
    from pgstreams import db

    with db.connect("default", "test") as conn:
        next_offset = conn.execute("SELECT next_offset FROM pgstreams_stream WHERE id = %s", [stream_id]).fetchone()[0]
        rows = conn.execute('SELECT data FROM pgstreams_chunk WHERE stream_id = %s ORDER BY "offset"', [stream_id])
        return next_offset, [r[0] for r in rows]


def test_close_and_errors_for_closed_and_unknown_streams() -> None:
    s = pgstreams.create_stream()
    pgstreams.write(s.id, "only")
    assert pgstreams.close(s.id) == 1
    with pytest.raises(pgstreams.StreamClosed, match="create a new stream"):
        pgstreams.write(s.id, "late")
    with pytest.raises(pgstreams.StreamClosed, match="already closed"):
        pgstreams.close(s.id)
    with pytest.raises(pgstreams.StreamClosed):
        pgstreams.write_many(s.id, ["late"])
    missing = uuid.uuid4()
    with pytest.raises(pgstreams.StreamNotFound, match=str(missing)):
        pgstreams.write(missing, "x")
    with pytest.raises(pgstreams.StreamNotFound):
        pgstreams.close(missing)
    with pytest.raises(pgstreams.StreamNotFound, match="not a stream id"):
        pgstreams.write("../etc/passwd", "x")
    assert stored(s) == [(0, "only")]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"bytes", TypeError),
        (None, TypeError),
        (42, TypeError),
        ("x" * 65537, pgstreams.ChunkTooLarge),
        ("é" * 32769, pgstreams.ChunkTooLarge),  # 65538 bytes in UTF-8
        ("nul\x00byte", pgstreams.InvalidChunk),
        ("\ud800", pgstreams.InvalidChunk),
    ],
)
def test_bad_chunks_are_refused_before_the_database(data, error, django_assert_num_queries) -> None:
    s = pgstreams.create_stream()
    with django_assert_num_queries(0):
        with pytest.raises(error):
            pgstreams.write(s.id, data)
        with pytest.raises(error):
            pgstreams.write_many(s.id, ["fine", data])
    assert stored(s) == []


@pytest.mark.parametrize("remembered", [True, False], ids=["made-here", "made-elsewhere"])
def test_a_json_stream_takes_one_json_value_per_chunk_and_nothing_else(remembered: bool) -> None:
    """Each chunk of an application/json stream is one message to its Durable Streams readers: a
    chunk that is two values, none, or not JSON would corrupt every reader's array. Refused with
    nothing written, whether this process made the stream (its kind remembered) or not."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    from pgstreams import contents

    s = pgstreams.create_stream(path="json/one-value", content_type="application/json")
    if not remembered:
        contents.kinds._known.pop(s.id)
    for bad in ("1,2", "", " ", "[1,", "NaN", "1e400", "'x'"):
        with pytest.raises(pgstreams.InvalidChunk, match="one JSON value"):
            pgstreams.write(s.id, bad)
        with pytest.raises(pgstreams.InvalidChunk, match="one JSON value"):
            pgstreams.write_many(s.id, ['"fine"', bad])
    assert pgstreams.write_many(s.id, ['"x"', "1", ' {"a": [1, 2]} ']) == [0, 1, 2]
    response = async_to_sync(AsyncClient().get)("/pgstreams/v1/stream/json/one-value")
    assert response.json() == ["x", 1, {"a": [1, 2]}] and response["Stream-Next-Offset"].startswith("0" * 15 + "3")


def test_a_stream_of_bytes_takes_no_text_from_python_writers() -> None:
    s = Stream.objects.create(path="bytes/raw", content_type="application/octet-stream")
    with pytest.raises(pgstreams.InvalidChunk, match="holds bytes"):
        pgstreams.write(s.id, "text")
    with pytest.raises(pgstreams.InvalidChunk, match="holds bytes"):
        pgstreams.write_many(s.id, ["text"])
    assert not Chunk.objects.filter(stream=s).exists()


def test_max_chunk_bytes_is_read_at_use() -> None:
    s = pgstreams.create_stream()
    assert pgstreams.write(s.id, "x" * 65536) == 0
    with override_settings(PGSTREAMS={"MAX_CHUNK_BYTES": 10}):
        with pytest.raises(pgstreams.ChunkTooLarge, match="MAX_CHUNK_BYTES'] = 10"):
            pgstreams.write(s.id, "x" * 11)
        assert pgstreams.write(s.id, "x" * 10) == 1


def test_write_many_rejects_a_string() -> None:
    s = pgstreams.create_stream()
    with pytest.raises(TypeError, match="list of str"):
        pgstreams.write_many(s.id, "abc")


@pytest.mark.parametrize("mode", ["buffered", "per_write", "off"])
def test_every_notify_mode_writes_the_same(mode: str) -> None:
    with override_settings(PGSTREAMS={"NOTIFY_MODE": mode}):
        s = pgstreams.create_stream()
        assert pgstreams.write(s.id, "a") == 0
        assert pgstreams.write_many(s.id, ["b", "c"]) == [1, 2]
        assert pgstreams.close(s.id) == 3
    assert stored(s) == [(0, "a"), (1, "b"), (2, "c")]


def _chunks_of(stream_ids: list[uuid.UUID]) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [stream_ids])
        return cursor.fetchone()[0]


@pytest.mark.parametrize("how", ["django", "sql", "truncate"])
def test_deleting_streams_deletes_their_chunks_in_the_database_and_no_others(how: str) -> None:
    kept, *gone = (pgstreams.create_stream().id for _ in range(4))
    for sid in (kept, *gone):
        pgstreams.write_many(sid, ["a", "b"])
    with connection.cursor() as cursor:
        if how == "django":
            Stream.objects.filter(pk__in=gone).delete()
        elif how == "sql":
            cursor.execute("DELETE FROM pgstreams_stream WHERE id = ANY(%s)", [gone])
        else:
            cursor.execute("TRUNCATE pgstreams_stream CASCADE")  # and what points at it (no key: the chunks)
    assert _chunks_of(gone) == 0
    assert _chunks_of([kept]) == (0 if how == "truncate" else 2)


def test_a_streams_id_cannot_change_under_its_chunks() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["a", "b"])
    with pytest.raises(IntegrityError, match="a stream's id cannot change"):
        Stream.objects.filter(pk=s.id).update(id=uuid.uuid4())
    assert _chunks_of([s.id]) == 2 and Stream.objects.filter(pk=s.id).exists()


def test_a_truncate_in_a_repeatable_read_transaction_leaves_no_chunk_committed_after_its_snapshot() -> None:
    s = pgstreams.create_stream()
    with db.connect("default", "test") as other:
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT 1")  # its snapshot, from which the chunk below is not seen
        pgstreams.write(s.id, "committed after the snapshot")
        other.execute("TRUNCATE pgstreams_stream CASCADE")
        other.execute("COMMIT")
    assert _chunks_of([s.id]) == 0


def test_streams_deleted_while_they_are_appended_to_keep_no_chunk() -> None:
    """Streams deleted one by one (Django's delete) while a task appends to all of them through
    the append path, and another writes in transactions: no chunk outlives its stream."""
    streams = [pgstreams.create_stream().id for _ in range(40)]

    async def append_all() -> None:
        for round in range(30):
            for sid in streams:
                with contextlib.suppress(pgstreams.StreamNotFound):
                    await pgstreams.aappend(sid, f"{round}")

    def write_all() -> None:
        try:
            for round in range(30):
                for sid in streams:
                    with contextlib.suppress(pgstreams.StreamNotFound), transaction.atomic():
                        pgstreams.write(sid, f"{round}")
        finally:
            connection.close()

    def delete_all() -> None:
        try:
            for sid in streams:
                time.sleep(0.01)
                Stream.objects.filter(pk=sid).delete()
        finally:
            connection.close()

    async def race() -> None:
        await asyncio.gather(
            append_all(),
            asyncio.to_thread(write_all),
            asyncio.to_thread(delete_all),
        )

    asyncio.run(race())
    assert not Stream.objects.filter(pk__in=streams).exists()
    assert _chunks_of(streams) == 0


async def test_async_twins() -> None:
    s = await pgstreams.acreate_stream(label="async")
    assert await pgstreams.awrite(s.id, "a") == 0
    assert await pgstreams.awrite_many(s.id, ["b", "c"]) == [1, 2]
    assert await pgstreams.aclose(s.id) == 3
    with pytest.raises(pgstreams.StreamClosed):
        await pgstreams.awrite(s.id, "d")
    assert [c.data async for c in pgstreams.aread(s.id)] == ["a", "b", "c"]


@pytest.mark.parametrize("prepared", [True, False])
def test_writes_are_prepared_statements_unless_turned_off(prepared: bool) -> None:
    connection.close()  # a fresh connection holds no prepared statement
    with override_settings(PGSTREAMS={"PREPARED_STATEMENTS": prepared}):
        s = pgstreams.create_stream()
        for i in range(3):
            assert pgstreams.write(s.id, "x") == i
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%pgstreams_chunk%"])
            assert cursor.fetchone()[0] == (1 if prepared else 0)


def _setting(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [name])
        return cursor.fetchone()[0]


@pytest.mark.parametrize("notify_mode", ["buffered", "per_write"])
@pytest.mark.parametrize("level", ["off", "local", "remote_write", "on", "remote_apply"])
def test_each_synchronous_commit_level_is_set_for_the_writing_transaction(level: str, notify_mode: str) -> None:
    s = pgstreams.create_stream()
    server_default = _setting("synchronous_commit")
    with override_settings(PGSTREAMS={"NOTIFY_MODE": notify_mode}):
        for call in (
            lambda: pgstreams.write(s, "a", synchronous_commit=level),
            lambda: pgstreams.write_many(s, ["b", "c"], synchronous_commit=level),
            lambda: pgstreams.close(s, synchronous_commit=level),
        ):
            with transaction.atomic():
                call()
                assert _setting("synchronous_commit") == level
            # SET LOCAL semantics: the level ends with its transaction.
            assert _setting("synchronous_commit") == server_default
    assert stored(s) == [(0, "a"), (1, "b"), (2, "c")]


def test_the_setting_is_the_default_level_and_an_argument_overrides_it() -> None:
    s = pgstreams.create_stream()
    with override_settings(PGSTREAMS={"SYNCHRONOUS_COMMIT": "local"}):
        with transaction.atomic():
            pgstreams.write(s, "a")
            assert _setting("synchronous_commit") == "local"
        with transaction.atomic():
            pgstreams.write(s, "b", synchronous_commit="remote_write")
            assert _setting("synchronous_commit") == "remote_write"


def test_in_one_transaction_the_strongest_level_asked_for_wins() -> None:
    s = pgstreams.create_stream()
    with transaction.atomic():
        pgstreams.write(s, "payment", synchronous_commit="remote_apply")
        pgstreams.write(s, "token", synchronous_commit="off")
        assert _setting("synchronous_commit") == "remote_apply"
    with transaction.atomic():
        pgstreams.write(s, "token", synchronous_commit="off")
        pgstreams.write(s, "log line", synchronous_commit="local")
        assert _setting("synchronous_commit") == "local"
        with transaction.atomic():  # a savepoint rolled back takes its level with it
            pgstreams.write(s, "undone", synchronous_commit="on")
            assert _setting("synchronous_commit") == "on"
            transaction.set_rollback(True)
        assert _setting("synchronous_commit") == "local"
    assert [data for _, data in stored(s)] == ["payment", "token", "token", "log line"]


@pytest.mark.parametrize("bad", ["ON", "sync", "remote apply", "on; DROP TABLE pgstreams_chunk", "", True, 1])
def test_an_unknown_synchronous_commit_is_a_value_error_and_writes_nothing(bad) -> None:
    s = pgstreams.create_stream()
    for call in (
        lambda: pgstreams.write(s, "a", synchronous_commit=bad),
        lambda: pgstreams.write_many(s, ["a"], synchronous_commit=bad),
        lambda: pgstreams.close(s, synchronous_commit=bad),
    ):
        with pytest.raises(ValueError, match="synchronous_commit must be one of 'off', 'local'"):
            call()
    s.refresh_from_db()
    assert (s.next_offset, s.closed_at, stored(s)) == (0, None, [])


@pytest.mark.parametrize("prepared", [True, False])
def test_a_dead_persistent_connection_is_replaced_when_health_checks_are_on(prepared: bool) -> None:
    from django.db import close_old_connections

    saved = {key: connection.settings_dict[key] for key in ("CONN_MAX_AGE", "CONN_HEALTH_CHECKS")}
    connection.settings_dict.update(CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=True)
    connection.close()  # reopened with the settings above
    try:
        with override_settings(PGSTREAMS={"PREPARED_STATEMENTS": prepared}):
            s = pgstreams.create_stream()
            pgstreams.write(s.id, "before")
            with db.connect("default", "test") as other:
                other.execute("SELECT pg_terminate_backend(%s, 10000)", [connection.connection.info.backend_pid])
            close_old_connections()  # a request ends and the next one starts
            assert pgstreams.write(s.id, "after") == 1
    finally:
        connection.close()
        connection.settings_dict.update(saved)


async def test_async_writes_queue_neither_behind_a_blocked_write_nor_block_other_sockets() -> None:
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import AnonymousUser

    from pgstreams.routing import websocket_urlpatterns

    locked, free = await pgstreams.acreate_stream(), await pgstreams.acreate_stream()
    await pgstreams.awrite(free.id, "ready")
    holder = await psycopg.AsyncConnection.connect(**db.connect_kwargs("default", "test"))
    async with holder.transaction():  # another connection holds the stream's row lock
        await holder.execute("SELECT 1 FROM pgstreams_stream WHERE id = %s FOR UPDATE", [locked.id])
        blocked = [asyncio.create_task(pgstreams.awrite(locked.id, "waits for the lock"))]
        await asyncio.sleep(0.3)
        # Another write goes on.
        assert await asyncio.wait_for(pgstreams.awrite(free.id, "meanwhile"), 10) == 1
        # With every write thread waiting on the lock, a WebSocket still connects (its
        # authorization lookup) and reads.
        blocked += [asyncio.create_task(pgstreams.awrite(locked.id, "waits")) for _ in range(conf.async_threads())]
        await asyncio.sleep(0.3)
        ws = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/pgstreams/{free.id}/")
        ws.scope["user"] = AnonymousUser()
        assert (await asyncio.wait_for(ws.connect(), 10))[0]
        frame = await ws.receive_json_from(10)
        assert [i["data"] for i in frame["items"]] == ["ready", "meanwhile"]
        await ws.disconnect()
        assert not any(task.done() for task in blocked)
    assert sorted(await asyncio.wait_for(asyncio.gather(*blocked), 10)) == list(range(len(blocked)))
    await holder.close()


async def test_async_writes_open_new_connections_after_the_server_closed_theirs() -> None:
    from django.db import connections

    from pgstreams import threads

    s = await pgstreams.acreate_stream()
    await asyncio.gather(*(pgstreams.awrite(s.id, "warm") for _ in range(8)))  # every pool thread connects

    def backend() -> int:
        return connections["default"].connection.info.backend_pid

    pids = {await threads.writes.wrap(backend)() for _ in range(16)}
    other = await psycopg.AsyncConnection.connect(**db.connect_kwargs("default", "test"))
    # As a server restart, or a pooler's idle timeout, would; once they are gone, write again.
    await other.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [list(pids)])
    for _ in range(100):
        cursor = await other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)])
        if (await cursor.fetchone())[0] == 0:
            break
        await asyncio.sleep(0.05)
    await other.close()
    offsets = await asyncio.gather(*(pgstreams.awrite(s.id, "after") for _ in range(8)))
    assert sorted(offsets) == list(range(8, 16))


async def test_a_stopped_pool_has_closed_the_connections_of_every_thread_when_stop_returns() -> None:
    """stop() returned once it had asked the threads to close, and a thread still busy closed
    later: a check right after it found backends still there (one CI run in many)."""
    from django.db import connections

    from pgstreams import threads

    s = await pgstreams.acreate_stream()
    size = conf.async_threads()
    every_thread = threading.Barrier(size, timeout=10)

    def connect() -> tuple[Any, int]:
        connections["default"].ensure_connection()
        every_thread.wait()  # so that each of the pool's threads runs one
        return connections["default"], connections["default"].connection.info.backend_pid

    opened = await asyncio.gather(*(threads.writes.wrap(connect)() for _ in range(size)))
    started, release = threading.Event(), threading.Event()

    def busy() -> None:
        started.set()
        release.wait(10)

    busy_call = asyncio.ensure_future(threads.writes.wrap(busy)())
    assert await asyncio.to_thread(started.wait, 10)
    threading.Timer(0.3, release.set).start()  # a thread still busy as the pool stops
    threads.writes.stop()
    assert [wrapper.connection for wrapper, _ in opened] == [None] * size
    await busy_call

    pids = [pid for _, pid in opened]
    other = await psycopg.AsyncConnection.connect(**db.connect_kwargs("default", "test"))
    for _ in range(100):  # a backend leaves a moment after its client closed
        cursor = await other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
        if (left := (await cursor.fetchone())[0]) == 0:
            break
        await asyncio.sleep(0.05)
    await other.close()
    assert len(set(pids)) == size > 1 and left == 0
    assert await pgstreams.awrite(s.id, "again") == 0  # new threads, new connections


@pytest.mark.parametrize("expiry", ["ttl", "expires_at"])
def test_a_stream_past_its_expiry_is_not_found_by_write_and_close_as_by_append(expiry: str) -> None:
    """write(), write_many() and close() succeeded on a stream whose Durable Streams expiry had
    passed, and a write renewed its TTL, where append() said StreamNotFound: now every one of
    them says StreamNotFound, writes nothing and renews nothing, as the endpoint would."""
    from django.utils import timezone

    s = pgstreams.create_stream()
    past = timezone.now() - datetime.timedelta(seconds=10)
    if expiry == "ttl":
        Stream.objects.filter(pk=s.pk).update(ttl=1, used_at=past)
    else:
        Stream.objects.filter(pk=s.pk).update(expires_at=past, used_at=past)
    calls = {
        "write": lambda: pgstreams.write(s.id, "x"),
        "write with a producer": lambda: pgstreams.write(s.id, "x", producer=pgstreams.Producer("p", 0, 0)),
        "write_many": lambda: pgstreams.write_many(s.id, ["x", "y"]),
        "close": lambda: pgstreams.close(s.id),
        "append": lambda: pgstreams.append(s.id, "x"),
    }
    answers = {}
    for name, call in calls.items():
        try:
            answers[name] = call()
        except pgstreams.StreamError as exc:
            answers[name] = type(exc).__name__
    assert answers == dict.fromkeys(calls, "StreamNotFound")
    s.refresh_from_db()
    assert (s.used_at, s.next_offset, s.closed_at) == (past, 0, None) and stored(s) == []
