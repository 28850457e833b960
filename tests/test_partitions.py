"""Chunks partitioned by their stream's day (``partitions``, ``pgstreams_partition``), on a
database of their own on the suite's server: converting a table keeps every read as it was, a
day expires by a DROP that leaves no dead tuple, a day a stream still needs is kept whole, a
random id that falls in a new day moves into it. (The whole suite also runs on a partitioned
table with ``PGSTREAMS_TEST_PARTITIONED=1``: conftest.py.)"""

from __future__ import annotations

import datetime
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DataError, connection, connections, transaction
from django.db.models import ProtectedError
from django.db.models.signals import post_delete, pre_delete
from django.test import override_settings

import pgstreams
from bench.scratch import installed
from pgstreams import maintenance, partitions, tasks
from pgstreams.durable import store
from pgstreams.fetch import FETCH_SQL
from pgstreams.models import Stream
from tests.helpers import PARTITIONED, in_thread
from tests.test_operations import kept_by_the_project

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", ALIAS := "partitioned"])

DAY = datetime.date(2026, 9, 1)
CUTOFF = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)


@pytest.fixture(scope="module")
def parts(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """A migrated database of its own, connected in this thread (a test case lets a test use an
    alias it did not set up only through a connection already open), its chunks partitioned."""
    with django_db_blocker.unblock():
        name = f"{connection.settings_dict['NAME']}_partitions"
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
            cursor.execute(f'CREATE DATABASE "{name}"')
        try:
            with installed({ALIAS: {**connection.settings_dict, "NAME": name}}, migrate=ALIAS):
                connections[ALIAS].ensure_connection()
                yield ALIAS
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sql(query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(query, params or [])
        return cursor.fetchall() if cursor.description else []


def streams(ids: list[uuid.UUID], chunks: int, closed_days_ago: int | None) -> None:
    """Streams ``ids`` of ``chunks`` chunks each, open or closed that many days ago."""
    closed = "NULL" if closed_days_ago is None else f"now() - interval '{int(closed_days_ago)} days'"
    sql(
        "INSERT INTO pgstreams_stream (id, label, content_type, next_offset, closed_at, created_at, metadata)"
        f" SELECT unnest(%s::uuid[]), '', 'text/plain', %s, {closed}, now(), '{{}}'::jsonb",
        [ids, chunks],
    )
    sql(
        'INSERT INTO pgstreams_chunk (stream_id, "offset", data, created_at)'
        " SELECT s, o, 'c' || o, now() FROM unnest(%s::uuid[]) s, generate_series(0, %s - 1) o",
        [ids, chunks],
    )


def on(day: datetime.date, n: int) -> list[uuid.UUID]:
    """``n`` ids of streams made on ``day``."""
    start = partitions.bound(day).int >> 80
    return [partitions.uuid7(start + 60_000 + i) for i in range(n)]


def where(ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The partition each stream's chunks are in."""
    return dict(
        sql(
            "SELECT stream_id, min(tableoid::regclass::text) FROM pgstreams_chunk WHERE stream_id = ANY(%s) GROUP BY 1",
            [ids],
        )
    )


def reads(ids: list[uuid.UUID]) -> tuple[Any, ...]:
    """What the listener's fetch and the Durable Streams read answer for ``ids``, from 0 and 3."""
    keys = [(s, start) for s in ids for start in (0, 3)]
    rows = (
        connections[ALIAS]
        .connection.execute(FETCH_SQL, ([k[0] for k in keys], [k[1] for k in keys], 100, 1 << 20))
        .fetchall()
    )
    return sorted(rows, key=repr), [store._chunks(ALIAS, s, 0, 1000) for s in ids]


def dead_chunk_tuples() -> int:
    """Dead tuples in the chunk tables, once this connection's counts are flushed."""
    sql("SELECT pg_stat_force_next_flush()")
    sql("SELECT 1")
    sql("SELECT pg_stat_clear_snapshot()")
    return sql("SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname LIKE 'pgstreams_chunk%%'")[
        0
    ][0]


def test_converting_keeps_every_read_as_it_was_and_new_days_hold_their_streams(parts: str) -> None:
    old = [uuid.uuid4() for _ in range(5)]
    streams(old, 20, None)
    before = reads(old)
    made = partitions.convert(1, using=parts, today=DAY)
    assert partitions.is_partitioned(parts)
    assert made == [partitions.name(DAY + datetime.timedelta(days=n)) for n in range(3)]  # twice as far
    assert reads(old) == before
    new = on(DAY, 3)
    streams(new, 10, None)
    assert set(where(old).values()) == {partitions.DEFAULT}
    assert set(where(new).values()) == {partitions.name(DAY)}
    assert partitions.convert(1, using=parts, today=DAY) == []  # once only


def test_a_day_whose_streams_all_closed_before_the_cutoff_goes_by_a_drop_leaving_no_dead_tuple(parts: str) -> None:
    day = DAY + datetime.timedelta(days=10)
    partitions.convert(0, using=parts, today=day)
    gone = on(day, 20)
    streams(gone, 100, 90)
    assert dead_chunk_tuples() == 0
    done = maintenance.prune(CUTOFF, using=parts)
    assert (done.streams, done.chunks) == (20, 2000)
    assert partitions.name(day) not in [table for _, table in partitions.days(parts)]
    assert partitions.drop(day, parts) is False  # as another prune finds it, dropped meanwhile
    assert sql("SELECT count(*) FROM pgstreams_stream WHERE id = ANY(%s)", [gone]) == [(0,)]
    assert dead_chunk_tuples() == 0
    # The same streams pruned row by row, in the default partition: the measure sees them.
    row_by_row = [uuid.uuid4() for _ in range(20)]
    streams(row_by_row, 100, 90)
    assert maintenance.prune(CUTOFF, using=parts).chunks == 2000
    assert dead_chunk_tuples() >= 2000
    sql("VACUUM pgstreams_chunk")


def test_a_day_dropped_while_a_writer_appends_to_todays_stream_loses_no_write(parts: str) -> None:
    """The drop holds the chunks' lock for a moment: writes wait, then commit, each once."""
    day = DAY + datetime.timedelta(days=5)
    partitions.convert(0, using=parts, today=day)
    gone = on(day, 50)
    streams(gone, 200, 90)
    with override_settings(PGSTREAMS={"DAY_PARTITIONS": True}):
        partitions.ensure(0, using=parts)
        live = Stream.objects.using(parts).create()
    stop, offsets, waits = threading.Event(), [], []

    def writer() -> None:
        while not stop.is_set() and len(offsets) < 5000:
            began = time.monotonic()
            offsets.append(pgstreams.write(live.id, f"w{len(offsets)}", using=ALIAS))
            waits.append(time.monotonic() - began)
        connections[ALIAS].close()

    thread = threading.Thread(target=writer, name="test-writer")
    thread.start()
    try:
        while len(offsets) < 20:
            time.sleep(0.01)
        assert maintenance.prune(CUTOFF, using=parts).streams == 50
        written = len(offsets)
        while len(offsets) < written + 20 and thread.is_alive():
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(30)
    assert partitions.name(day) not in [table for _, table in partitions.days(parts)]
    assert offsets == list(range(len(offsets)))
    held = sql('SELECT "offset", data FROM pgstreams_chunk WHERE stream_id = %s ORDER BY 1', [live.id])
    assert held == [(n, f"w{n}") for n in range(len(offsets))]
    print(
        f"{len(offsets)} writes, each committed once in order, across a drop of a day of 50 streams x 200 chunks;"
        f" the longest write {max(waits) * 1000:.1f} ms (median {sorted(waits)[len(waits) // 2] * 1000:.1f} ms)"
    )


def test_a_day_with_a_stream_still_open_is_kept_and_its_closed_streams_are_pruned_as_before(parts: str) -> None:
    day = DAY + datetime.timedelta(days=20)
    partitions.convert(0, using=parts, today=day)
    closed, still_open = on(day, 5), on(day + datetime.timedelta(hours=12), 1)
    streams(closed, 10, 90)
    streams(still_open, 10, None)
    assert maintenance.prune(CUTOFF, using=parts).streams == 5
    assert partitions.name(day) in [table for _, table in partitions.days(parts)]
    assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [closed + still_open]) == [(10,)]


def test_a_day_a_project_object_keeps_a_stream_of_is_kept_whole(parts: str) -> None:
    day = DAY + datetime.timedelta(days=30)
    partitions.convert(0, using=parts, today=day)
    ids = on(day, 4)
    streams(ids, 10, 90)
    with kept_by_the_project(ALIAS) as pin:
        pin.objects.using(ALIAS).create(stream_id=ids[2])
        with pytest.raises(ProtectedError):
            maintenance.prune(CUTOFF, using=parts)
        assert partitions.name(day) in [table for _, table in partitions.days(parts)]
        assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [ids]) == [(40,)]
        pin.objects.using(ALIAS).all().delete()
    assert maintenance.prune(CUTOFF, using=parts).streams == 4
    assert partitions.name(day) not in [table for _, table in partitions.days(parts)]


def test_a_project_object_made_while_a_day_is_pruned_keeps_its_stream_whole(parts: str) -> None:
    """A stream of the day's second batch pinned (on_delete=PROTECT) while the first is deleted:
    the prune stops as it does today, the first batch is gone with its chunks, and every other
    stream keeps all of its chunks (dropping the day first, with a check before, lost them)."""
    day = DAY + datetime.timedelta(days=12)
    partitions.convert(0, using=parts, today=day)
    ids = on(day, 1200)
    streams(ids, 3, 90)
    with kept_by_the_project(ALIAS) as pin:

        def pin_the_last(sender: Any, **kwargs: Any) -> None:
            post_delete.disconnect(pin_the_last, sender=Stream)
            in_thread(lambda: pin.objects.using(ALIAS).create(stream_id=ids[-1]))

        post_delete.connect(pin_the_last, sender=Stream)
        try:
            with pytest.raises(ProtectedError):
                maintenance.prune(CUTOFF, using=parts)
        finally:
            post_delete.disconnect(pin_the_last, sender=Stream)
        left = dict(sql("SELECT stream_id, count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s) GROUP BY 1", [ids]))
        assert left == {stream_id: 3 for stream_id in ids[1000:]}  # the first batch went whole, the rest stays
        assert sql("SELECT count(*) FROM pgstreams_stream WHERE id = ANY(%s)", [ids]) == [(200,)]
        assert partitions.name(day) in [table for _, table in partitions.days(parts)]
        pin.objects.using(ALIAS).all().delete()
    assert maintenance.prune(CUTOFF, using=parts).streams == 200


def test_the_project_receivers_see_a_pruned_days_streams_with_their_chunks(parts: str) -> None:
    """As in any prune: the streams go before their chunks (dropping the day first showed a
    receiver, a fork or a reader a stream without its chunks)."""
    day = DAY + datetime.timedelta(days=14)
    partitions.convert(0, using=parts, today=day)
    ids = on(day, 3)
    streams(ids, 7, 90)
    seen = {}

    def count(sender: Any, instance: Stream, **kwargs: Any) -> None:
        seen[instance.pk] = sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = %s", [instance.pk])[0][0]

    pre_delete.connect(count, sender=Stream)
    try:
        assert maintenance.prune(CUTOFF, using=parts).chunks == 21
    finally:
        pre_delete.disconnect(count, sender=Stream)
    assert seen == {stream_id: 7 for stream_id in ids}
    assert partitions.name(day) not in [table for _, table in partitions.days(parts)]


def test_a_stream_a_receiver_deletes_during_a_days_prune_loses_its_chunks_as_always(parts: str) -> None:
    """Only the day's streams leave their chunks to its drop: another stream deleted in the same
    transaction (a receiver's, here one of today's and one from before the conversion) kept
    them for good."""
    day = DAY + datetime.timedelta(days=18)
    partitions.convert(0, using=parts, today=day)
    ids = on(day, 2)
    streams(ids, 3, 90)
    partitions.ensure(0, using=parts)
    others = [uuid.uuid4(), on(datetime.datetime.now(datetime.UTC).date(), 1)[0]]
    streams(others, 4, None)

    def delete_the_others(sender: Any, **kwargs: Any) -> None:
        post_delete.disconnect(delete_the_others, sender=Stream)
        Stream.objects.using(ALIAS).filter(pk__in=others).delete()

    post_delete.connect(delete_the_others, sender=Stream)
    try:
        maintenance.prune(CUTOFF, using=parts)
    finally:
        post_delete.disconnect(delete_the_others, sender=Stream)
    assert partitions.name(day) not in [table for _, table in partitions.days(parts)]
    assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [others]) == [(0,)]


def test_a_prune_in_a_transaction_goes_row_by_row_and_leaves_no_setting_or_lock(parts: str) -> None:
    day = DAY + datetime.timedelta(days=19)
    partitions.convert(0, using=parts, today=day)
    ids = on(day, 2)
    streams(ids, 3, 90)
    with transaction.atomic(using=ALIAS):
        assert maintenance.prune(CUTOFF, using=parts).streams == 2
        assert sql("SELECT coalesce(current_setting('pgstreams.day_dropped', true), '')") == [("",)]
        assert (
            sql("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND mode = 'AccessExclusiveLock'")[0][0]
            == 0
        )
        with pytest.raises(RuntimeError, match="call it outside transaction.atomic"):
            partitions.ensure(0, using=parts, today=day + datetime.timedelta(days=1))
    assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [ids]) == [(0,)]
    assert partitions.name(day) in [table for _, table in partitions.days(parts)]  # kept, empty


def test_the_chunks_a_stopped_prune_left_go_at_the_next_though_the_day_is_kept(parts: str) -> None:
    """A prune stopped between a day's batches, then a stream made in the day (a clock behind):
    the next prune keeps the day for it, and removes what the first left."""
    day = DAY + datetime.timedelta(days=21)
    partitions.convert(0, using=parts, today=day)
    gone, late = on(day, 2), on(day + datetime.timedelta(hours=6), 1)
    streams(gone, 3, 90)
    partitions.mark_dropping(day, parts)
    with transaction.atomic(using=ALIAS), connections[ALIAS].cursor() as cursor:
        with partitions.dropping_day(cursor, day):
            Stream.objects.using(ALIAS).filter(pk__in=gone).delete()
    assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [gone]) == [(6,)]  # left
    streams(late, 2, None)
    maintenance.prune(CUTOFF, using=parts)
    assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [gone]) == [(0,)]
    assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [late]) == [(2,)]
    assert partitions.days(parts, marked=True) == []


def test_a_day_another_prune_drops_meanwhile_is_passed_over_whatever_step_this_one_is_at(parts: str) -> None:
    """Its mark, and the removal of what a stopped prune left, wait for the other's drop, then
    find the day gone (they failed on "relation does not exist", and ended the prune)."""
    day = DAY + datetime.timedelta(days=23)
    partitions.convert(0, using=parts, today=day)
    holder = holding_the_lock(0.3, then=f"DROP TABLE {partitions.name(day)}")
    try:
        assert partitions.mark_dropping(day, parts) is False
    finally:
        holder.join(10)
    partitions.ensure(0, using=parts, today=day)
    holder = holding_the_lock(0.3, then=f"DROP TABLE {partitions.name(day)}")
    try:
        assert partitions.remove_orphans(day, parts) == 0
    finally:
        holder.join(10)


def test_a_receivers_database_error_in_a_days_prune_is_raised_as_it_is(parts: str) -> None:
    """Not hidden by the reset of the day's setting in the failed transaction (it raised
    TransactionManagementError); the day is kept whole."""
    day = DAY + datetime.timedelta(days=24)
    partitions.convert(0, using=parts, today=day)
    ids = on(day, 2)
    streams(ids, 3, 90)

    def fail(sender: Any, **kwargs: Any) -> None:
        sql("SELECT 1 / 0")

    post_delete.connect(fail, sender=Stream)
    try:
        with pytest.raises(DataError, match="division by zero"):
            maintenance.prune(CUTOFF, using=parts)
    finally:
        post_delete.disconnect(fail, sender=Stream)
    assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [ids]) == [(6,)]
    assert partitions.days(parts, marked=True) == []


def test_a_sessions_own_value_of_the_days_setting_keeps_no_chunk(parts: str) -> None:
    """Set at the session's level (as a client of a pooled connection could leave it), a value
    that is no day's range is none: a stream's delete deletes its chunks (it raised DataError)."""
    ids = [uuid.uuid4()]
    streams(ids, 3, None)
    for value in ("on", "garbage", "", partitions.bound(DAY).hex):
        sql("SELECT set_config('pgstreams.day_dropped', %s, false)", [value])
        try:
            Stream.objects.using(ALIAS).filter(pk__in=ids).delete()
        finally:
            sql("RESET pgstreams.day_dropped")
        assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [ids]) == [(0,)], value
        streams(ids, 3, None)


def holding_the_lock(
    seconds: float, then: str = "", mode: str = "ACCESS EXCLUSIVE", only: bool = False
) -> threading.Thread:
    """A transaction of another connection that holds the chunk table's lock (``only`` the table,
    not its days) for ``seconds``, having run ``then`` under it; begun before this returns."""
    held = threading.Event()

    def hold() -> None:
        with transaction.atomic(using=ALIAS), connections[ALIAS].cursor() as cursor:
            cursor.execute(f"LOCK TABLE {'ONLY ' if only else ''}pgstreams_chunk IN {mode} MODE")
            if then:
                cursor.execute(then)
            held.set()
            time.sleep(seconds)
        connections[ALIAS].close()

    thread = threading.Thread(target=hold, name="test-lock-holder")
    thread.start()
    assert held.wait(10)
    return thread


def test_a_day_another_process_drops_meanwhile_is_passed_over(parts: str) -> None:
    day = DAY + datetime.timedelta(days=16)
    partitions.convert(0, using=parts, today=day)
    holder = holding_the_lock(0.3, then=f"DROP TABLE {partitions.name(day)}")
    try:
        assert partitions.drop(day, parts) is False  # it waited for the lock, then found the day gone
    finally:
        holder.join(10)


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Each call in a thread of its own (with its own connections), started together; what each
    returned, or raised."""
    go, results = threading.Barrier(len(calls)), [None] * len(calls)

    def run(n: int) -> None:
        go.wait(5)
        try:
            results[n] = calls[n]()
        except BaseException as exc:
            results[n] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n,), name=f"test-at-once-{n}") for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_two_processes_making_days_at_once_make_each_once(parts: str) -> None:
    """Both find the days missing, then wait for the lock (another transaction holds it): the
    second to have it finds them made (it made them again, and failed on "already exists")."""
    partitions.convert(0, using=parts)
    start = datetime.date(2027, 6, 1)
    holder = holding_the_lock(0.5)
    made = at_once(*[lambda: partitions.ensure(2, using=ALIAS, today=start)] * 2)
    holder.join(10)
    assert sorted(made, key=len) == [[], [partitions.name(start + datetime.timedelta(days=n)) for n in range(5)]]


def test_a_dropped_days_ids_go_to_the_default_partition_though_days_around_it_were_just_made(parts: str) -> None:
    """A stream made by a clock behind, or given its id, in a day already dropped: its chunks are
    held by the default partition (the check that keeps the days last made out of it refused them)."""
    start = datetime.date(2027, 7, 1)
    partitions.convert(0, using=parts)
    assert len(partitions.ensure(2, using=parts, today=start)) == 5
    assert partitions.drop(start + datetime.timedelta(days=1), parts)
    late = on(start + datetime.timedelta(days=1), 1)
    streams(late, 4, None)
    assert where(late) == {late[0]: partitions.DEFAULT}


def test_pruning_and_making_days_at_once_never_deadlock(parts: str) -> None:
    """Both take the chunk table's lock first. The making of days queued for it (behind a
    transaction that holds the table alone), then a prune: a prune that locked its day, then
    queued for the table, deadlocked with the making of days, which locks the table's days too."""
    day = DAY + datetime.timedelta(days=22)
    partitions.convert(0, using=parts, today=day)
    streams(on(day, 20), 5, 90)
    holder = holding_the_lock(1.0, mode="ACCESS SHARE", only=True)

    def prune_a_moment_later() -> maintenance.Pruned:
        time.sleep(0.3)
        return maintenance.prune(CUTOFF, using=ALIAS)

    made, pruned = at_once(
        lambda: partitions.ensure(3, using=ALIAS, today=datetime.date(2028, 1, 1)), prune_a_moment_later
    )
    holder.join(10)
    assert len(made) == 7 and pruned.streams == 20, (made, pruned)


def test_a_random_id_that_falls_in_a_new_days_range_moves_into_it(parts: str) -> None:
    day = DAY + datetime.timedelta(days=40)
    partitions.convert(0, using=parts, today=day - datetime.timedelta(days=1))
    stray = uuid.UUID(int=partitions.bound(day).int | 0x4000_8000_0000_0000_1234)  # a version 4 id there
    streams([stray], 7, None)
    assert where([stray]) == {stray: partitions.DEFAULT}
    before = reads([stray])
    assert partitions.ensure(0, using=parts, today=day) == [partitions.name(day)]
    assert where([stray]) == {stray: partitions.name(day)}
    assert reads([stray]) == before
    assert partitions.ensure(0, using=parts, today=day) == []


def test_days_are_made_ahead_at_a_time(parts: str) -> None:
    partitions.convert(0, using=parts)
    start = DAY + datetime.timedelta(days=60)
    names = [partitions.name(start + datetime.timedelta(days=n)) for n in range(8)]
    assert partitions.ensure(2, using=parts, today=start) == names[:5]
    assert partitions.ensure(2, using=parts, today=start + datetime.timedelta(days=2)) == []
    assert partitions.ensure(2, using=parts, today=start + datetime.timedelta(days=3)) == names[5:]


def test_with_day_partitions_on_a_stream_is_made_in_todays_partition(parts: str) -> None:
    partitions.convert(0, using=parts)
    with override_settings(PGSTREAMS={"DAY_PARTITIONS": True}):
        stream = Stream.objects.using(parts).create()
        assert partitions.new_stream_id().version == 7 and stream.id.version == 7
    assert partitions.new_stream_id().version == 4  # off: random, as before
    sql(
        'INSERT INTO pgstreams_chunk (stream_id, "offset", data, created_at) VALUES (%s, 0, %s, now())',
        [stream.id, "x"],
    )
    today = datetime.datetime.now(datetime.UTC).date()
    assert where([stream.id]) == {stream.id: partitions.name(today)}
    figures = maintenance.stats(parts)
    assert figures["sizes"]["pgstreams_chunk"]["table_bytes"] > 0  # its partitions', summed
    assert figures["days"]["first"] <= today <= figures["days"]["last"]


def test_the_command_and_the_task_make_the_days_ahead_and_say_when_ids_are_random(parts: str, capsys: Any) -> None:
    with override_settings(PGSTREAMS={"DATABASE": ALIAS}):
        call_command("pgstreams_partition", "--ahead", "3")
        out, err = capsys.readouterr()
        today = datetime.datetime.now(datetime.UTC).date()
        assert partitions.name(today + datetime.timedelta(days=3)) in [t for _, t in partitions.days(parts)]
        assert "DAY_PARTITIONS" in err
        call_command("pgstreams_stats")
        assert re.search(rf"\ndays partitioned +{len(partitions.days(parts))}, from ", capsys.readouterr().out)
        with override_settings(PGSTREAMS={"DATABASE": ALIAS, "DAY_PARTITIONS": True}):
            call_command("pgstreams_partition", "--ahead", "3")
        out, err = capsys.readouterr()
        assert out.startswith("no day to make; the days held run from ") and err == ""
        made = tasks.partition.call(ahead=10)  # the task, for a project's schedule
        assert made == [partitions.name(today + datetime.timedelta(days=n)) for n in range(7, 21)]
        with pytest.raises(CommandError, match="from 0 to 90"):
            call_command("pgstreams_partition", "--ahead", "-1")


def test_the_commands_give_up_on_a_lock_they_cannot_have_and_change_nothing(parts: str, monkeypatch: Any) -> None:
    day = DAY + datetime.timedelta(days=50)
    partitions.convert(0, using=parts, today=day)
    ids = on(day, 3)
    streams(ids, 10, 90)
    monkeypatch.setattr(partitions, "LOCK_TIMEOUT", "200ms")
    monkeypatch.setattr(partitions, "LOCK_TRIES", 2)
    monkeypatch.setattr(partitions, "LOCK_PAUSE", 0.1)
    held, release = threading.Event(), threading.Event()

    def reader() -> None:  # a long transaction that read the chunks
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT count(*) FROM pgstreams_chunk")
            held.set()
            release.wait(10)
            cursor.execute("ROLLBACK")
        connections[ALIAS].close()

    thread = threading.Thread(target=reader, name="test-long-reader")
    thread.start()
    try:
        assert held.wait(10)
        before = partitions.days(parts)
        with override_settings(PGSTREAMS={"DATABASE": ALIAS}):
            with pytest.raises(CommandError, match="lock was not had in 2 tries of 200ms .*; nothing changed"):
                call_command("pgstreams_partition", "--ahead", "30")
            with pytest.raises(CommandError, match="lock was not had in 2 tries of 200ms .*, to drop a day"):
                call_command("pgstreams_prune", "--closed-before", "30d")
        assert partitions.days(parts) == before
        assert sql("SELECT count(*) FROM pgstreams_chunk WHERE stream_id = ANY(%s)", [ids]) == [(30,)]
    finally:
        release.set()
        thread.join(10)
    assert maintenance.prune(CUTOFF, using=parts).streams == 3


def test_pgstreams_migrations_of_the_chunk_table_run_on_the_partitioned_table(parts: str) -> None:
    """Back before 0007, which adds the chunks' ``run`` column, and forward again: the column is
    dropped from and added to every partition, and the reads answer as before."""
    partitions.convert(0, using=parts)
    ids = [uuid.uuid4(), *on(datetime.datetime.now(datetime.UTC).date(), 2)]
    streams(ids, 5, None)
    before = reads(ids)
    call_command("migrate", "pgstreams", "0006", database=ALIAS, verbosity=0)
    assert sql(
        "SELECT count(*) FROM pg_attribute WHERE attname = 'run' AND attrelid::regclass::text LIKE 'pgstreams_chunk%%'"
    ) == [(0,)]
    call_command("migrate", "pgstreams", database=ALIAS, verbosity=0)
    assert partitions.is_partitioned(parts) and reads(ids) == before


@pytest.mark.skipif(PARTITIONED, reason="the test database's chunks are partitioned")
def test_ensure_on_a_table_not_partitioned_says_to_convert_it() -> None:
    with pytest.raises(ValueError, match="run manage.py pgstreams_partition once"):
        partitions.ensure(1)


def test_a_version_7_id_holds_its_time_and_sorts_by_it() -> None:
    made = [partitions.uuid7(1_800_000_000_000 + n) for n in range(50)]
    assert [u.version for u in made] == [7] * 50 and {u.variant for u in made} == {uuid.RFC_4122}
    assert made == sorted(made) and made[0].int >> 80 == 1_800_000_000_000
    last = partitions.uuid7((partitions.bound(DAY + datetime.timedelta(days=1)).int >> 80) - 1)
    assert partitions.bound(DAY) < last < partitions.bound(DAY + datetime.timedelta(days=1))
