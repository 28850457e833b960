"""The operations commands on real data (tail, prune, stats) and the stream_closed signal."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, models, transaction
from django.db.models import ProtectedError
from django.db.models.signals import post_delete
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pgstreams
from pgstreams import db, maintenance
from pgstreams.models import Chunk, Stream
from pgstreams.signals import stream_closed
from tests.helpers import ROOT, subprocess_database_url

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def closed_stream(chunks: int, closed_days_ago: float) -> Stream:
    s = pgstreams.create_stream()
    if chunks:
        pgstreams.write_many(s.id, [f"c{i}" for i in range(chunks)])
    pgstreams.close(s.id)
    Stream.objects.filter(pk=s.pk).update(closed_at=timezone.now() - datetime.timedelta(days=closed_days_ago))
    return s


def test_tail_prints_until_the_end_and_resumes() -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["Hello", ", ", "world"])
    pgstreams.close(s.id)
    assert run("pgstreams_tail", str(s.id)) == "Hello, world\n"
    lines = [json.loads(line) for line in run("pgstreams_tail", str(s.id), "--from", "1", "--json").splitlines()]
    assert [(x["offset"], x["data"]) for x in lines] == [(1, ", "), (2, "world")]
    with pytest.raises(CommandError, match="not a stream id"):
        run("pgstreams_tail", "nope")


def test_tail_follows_live_writes() -> None:
    s = pgstreams.create_stream()
    out = io.StringIO()
    tail = threading.Thread(target=call_command, args=("pgstreams_tail", str(s.id)), kwargs={"stdout": out})
    tail.start()
    for word in ("a", "b", "c"):
        pgstreams.write(s.id, word)
        time.sleep(0.05)
    pgstreams.close(s.id)
    tail.join(10)
    assert not tail.is_alive() and out.getvalue() == "abc\n"


@pytest.mark.multiprocess
def test_ctrl_c_stops_tail_quietly() -> None:
    s = pgstreams.create_stream()
    pgstreams.write(s.id, "first")
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    # Where this process ignores SIGINT (a shell's background job does, and its children inherit
    # that through exec: Python then installs no KeyboardInterrupt), a handler of its own makes
    # the child start with the default, as a command typed at a terminal does.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "manage.py", "pgstreams_tail", str(s.id)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert proc.stdout.read(5) == "first"
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints where every thread is
        pytest.fail(f"pgstreams_tail did not stop within 15 s of Ctrl-C:\n{proc.communicate(timeout=15)[1]}")
    assert proc.returncode == 0 and "Traceback" not in err


def test_prune_deletes_old_closed_streams_in_batches_and_never_open_ones() -> None:
    old_small = [closed_stream(3, 10) for _ in range(5)]
    old_big = closed_stream(25, 9)  # larger than a batch: deleted in slices
    recent = closed_stream(4, 1)
    still_open = pgstreams.create_stream()
    pgstreams.write_many(still_open.id, ["x"] * 6)
    Stream.objects.filter(pk=still_open.pk).update(created_at=timezone.now() - datetime.timedelta(days=30))

    out = run("pgstreams_prune", "--closed-before", "7d", "--dry-run")
    assert "would delete 6 stream(s)" in out and "with 40 chunk(s)" in out
    assert Stream.objects.count() == 8

    seen: list[maintenance.Pruned] = []
    done = maintenance.prune(
        maintenance.parse_cutoff("7d"),
        batch=10,
        progress=lambda p: seen.append(maintenance.Pruned(p.streams, p.chunks)),
    )
    assert (done.streams, done.chunks) == (6, 40)
    assert len(seen) >= 3  # several short transactions, not one
    left = set(Stream.objects.values_list("pk", flat=True))
    assert left == {recent.pk, still_open.pk}
    assert not Chunk.objects.filter(stream_id__in=[s.pk for s in [*old_small, old_big]]).exists()
    assert Chunk.objects.filter(stream_id=still_open.pk).count() == 6
    assert "nothing to delete" in run("pgstreams_prune", "--closed-before", "7d")
    with pytest.raises(CommandError):
        run("pgstreams_prune", "--closed-before", "later")


def test_prune_finds_its_batches_through_an_index_not_a_scan_and_sort() -> None:
    from django.db import connection

    for _ in range(20):
        pgstreams.close(pgstreams.create_stream().id)
    with transaction.atomic(), connection.cursor() as cursor:
        # What the planner picks on a large table, where LIMIT makes an ordered index scan cheapest.
        cursor.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")
        cursor.execute("EXPLAIN " + maintenance.CANDIDATES_SQL, [timezone.now(), 1000])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "pgstreams_stream_closed" in plan and "Sort" not in plan, plan


def test_prune_while_a_writer_writes() -> None:
    for _ in range(20):
        closed_stream(50, 10)
    live = pgstreams.create_stream()
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:
        while not stop.is_set():
            written.append(pgstreams.write(live.id, "w"))
        from django.db import connection

        connection.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        done = maintenance.prune(maintenance.parse_cutoff("7d"), batch=100)
    finally:
        stop.set()
        writer.join(10)
    assert (done.streams, done.chunks) == (20, 1000)
    assert written == list(range(len(written))) and len(written) > 0
    assert Chunk.objects.filter(stream_id=live.pk).count() == len(written)


def test_stats() -> None:
    closed_stream(3, 1)
    s = pgstreams.create_stream()
    pgstreams.write(s.id, "x")
    figures = json.loads(run("pgstreams_stats", "--json"))
    assert (figures["streams_open"], figures["streams_closed"], figures["chunks"]) == (1, 1, 4)
    assert figures["sizes"]["pgstreams_chunk"]["table_bytes"] > 0
    assert 0 <= figures["notification_queue_usage"] < 1
    assert figures["settings"]["NOTIFY_MODE"] == "buffered"


def test_stats_puts_every_value_in_one_column_after_at_least_two_spaces() -> None:
    pgstreams.create_stream()
    lines = run("pgstreams_stats").splitlines()
    names = [line.split("  ", 1)[0] for line in lines]
    assert "LISTEN_CHECK_INTERVAL" in names and "streams open" in names  # a long name, a short one
    column = len(max(names, key=len)) + 2
    assert all(line[column - 2 : column] == "  " and line[column] != " " for line in lines), lines
    assert lines[names.index("streams open")][column:] == "1"


def test_stream_closed_is_sent_after_commit_only() -> None:
    received = []

    def receiver(sender, **kwargs):
        received.append((sender, kwargs["stream_id"], kwargs["next_offset"], kwargs["using"]))

    stream_closed.connect(receiver)
    try:
        s = pgstreams.create_stream()
        pgstreams.write(s.id, "x")
        with pytest.raises(RuntimeError), transaction.atomic():
            pgstreams.close(s.id)
            assert received == []  # not before commit
            raise RuntimeError
        assert received == []  # never for a rollback
        with transaction.atomic():
            pgstreams.close(s.id)
            assert received == []
        assert received == [(Stream, s.id, 1, "default")]
    finally:
        stream_closed.disconnect(receiver)


FORKS_OPEN = {"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything"}


def test_prune_leaves_a_tombstone_of_a_closed_stream_with_forks_as_a_delete_does() -> None:
    """A closed source with a fork was deleted outright, freeing its path (a new stream could be
    made there) where a Durable Streams DELETE keeps it taken while forks remain; the tombstone
    goes with its last fork, at the same prune."""
    from django.test import Client, override_settings

    endpoint = "/pgstreams/v1/stream/"
    client = Client()
    with override_settings(PGSTREAMS=FORKS_OPEN):
        client.put(f"{endpoint}pruned/source", "inherited", content_type="text/plain")
        fork = client.put(f"{endpoint}pruned/fork", headers={"Stream-Forked-From": "pruned/source"})
        assert fork.status_code == 201
    source = Stream.objects.get(path="pruned/source")
    pgstreams.close(source.id)
    Stream.objects.filter(pk=source.pk).update(closed_at=timezone.now() - datetime.timedelta(days=30))
    done = maintenance.prune(maintenance.parse_cutoff("7d"))
    assert (done.streams, done.chunks) == (1, 1)
    source.refresh_from_db()
    assert source.deleted_at is not None and not Chunk.objects.filter(stream_id=source.pk).exists()
    assert Stream.objects.get(path="pruned/fork").forked_from_id == source.pk
    with override_settings(PGSTREAMS=FORKS_OPEN):
        assert client.head(f"{endpoint}pruned/source").status_code == 410
        assert client.put(f"{endpoint}pruned/source", content_type="text/plain").status_code == 409
    assert client.get(f"{endpoint}pruned/fork").content == b"inherited"
    fork = Stream.objects.get(path="pruned/fork")
    pgstreams.close(fork.id)
    Stream.objects.filter(pk=fork.pk).update(closed_at=timezone.now() - datetime.timedelta(days=30))
    assert maintenance.prune(maintenance.parse_cutoff("7d")).streams == 1
    assert not Stream.objects.filter(path__startswith="pruned/").exists()  # the tombstone went with its fork


def test_tail_of_a_stream_whose_first_chunks_were_pruned_says_where_to_resume() -> None:
    """It printed a ChunksPruned traceback: now a CommandError naming the first offset still
    held and the --from that reads from there, which then prints the rest."""
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["a", "b", "c", "d"])
    pgstreams.close(s.id)
    Chunk.objects.filter(stream_id=s.id, offset__lt=2).delete()  # as a prune's first slice does
    with pytest.raises(CommandError, match=r"no longer holds chunks 0 to 1 .* run it again with --from 2$"):
        run("pgstreams_tail", str(s.id))
    assert run("pgstreams_tail", str(s.id), "--from", "2") == "cd\n"


@pytest.mark.parametrize(
    "age", ["99999999999d", "999999999d", "9999999999999999999999w", "9" * 5000 + "s", "٩٩٩٩٩٩٩٩٩٩h"]
)
def test_prune_with_an_age_before_the_year_1_says_the_largest_age_accepted(age: str) -> None:
    """OverflowError ("date value out of range"), or a message about Python's digit limit: now a
    CommandError giving the largest age in the unit asked, which itself is accepted."""
    with pytest.raises(CommandError, match=r"reaches back before the year 1") as raised:
        run("pgstreams_prune", "--closed-before", age, "--dry-run")
    largest = re.search(r"the largest age accepted is (\d+[smhdw]);", str(raised.value))
    assert largest is not None and largest.group(1)[-1] == age[-1]
    assert "would remove" in run("pgstreams_prune", "--closed-before", largest.group(1), "--dry-run")


def _offset_ish(draw: Any) -> str:
    """Text that looks like a number to people, if not to every parser."""
    number = draw(st.one_of(st.integers(), st.integers(2**63 - 2, 2**70), st.just("9" * 5000)))
    digits = draw(st.sampled_from(["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９"]))
    text = "".join(digits[int(c)] if c.isdigit() else c for c in str(number))
    pad = draw(st.sampled_from(["", " ", "\t", "\n", "\x00", "\u2003", "_", "+"]))
    return draw(st.sampled_from([text, f"{pad}{text}", f"{text}{pad}", f"{text[:1]}{pad}{text[1:]}"]))


HOSTILE = st.one_of(
    st.text(),
    st.sampled_from(["", "--", "-", "-1", "--json", "=", "\x00"]),
    st.text(st.characters(categories=["Nd", "No", "Zs", "Cc", "Pd"]), max_size=12),
    st.composite(_offset_ish)(),
)
AGES = st.one_of(
    HOSTILE,
    st.builds(lambda n, unit: f"{n}{unit}", st.composite(_offset_ish)(), st.sampled_from([*"smhdwy", " d", "D", ""])),
    st.builds(
        lambda moment, offset: moment.replace(tzinfo=datetime.timezone(offset)).isoformat(),
        st.datetimes(),
        st.integers(-1439, 1439).map(lambda minutes: datetime.timedelta(minutes=minutes)),
    ),
    st.datetimes().map(lambda moment: moment.isoformat()),
)


def answered(*args: str) -> str:
    """What the command prints, or its CommandError's message; any other exception fails. Help
    and --version (argparse exits 0 after printing them) count as an answer."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return run(*args)
    except CommandError as exc:
        assert str(exc).strip(), f"an empty error for {args!r}"
        return str(exc)
    except SystemExit as exc:
        assert exc.code == 0, f"argparse exited {exc.code} for {args!r}"
        return ""


@settings(max_examples=100, deadline=None)
@given(age=AGES, batch=HOSTILE, dry=st.booleans())
@example(age="0001-01-01000-1600", batch="1", dry=False)  # found: an offset PostgreSQL refuses
@example(age="9999-12-31T23:00-01:00", batch="1", dry=True)  # after 9999 in UTC
@example(age="--", batch="1", dry=True)  # found: Python 3.11's argparse reads "--closed-before=--" as []
@example(age="0s", batch="--", dry=True)
def test_pgstreams_prune_answers_any_text_as_its_options_or_says_what_is_wrong(age: str, batch: str, dry: bool) -> None:
    """Any text as --closed-before and --batch (huge, negative, Unicode digits, whitespace, NUL,
    dates at either end of the calendar): its figures, or a CommandError, never a traceback."""
    args = ["pgstreams_prune", f"--closed-before={age}", f"--batch={batch}"]
    answered(*args, *(["--dry-run"] if dry else []))


@pytest.fixture
def ended_stream() -> Stream:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["a", "b"])
    pgstreams.close(s.id)
    return s


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stream=st.one_of(HOSTILE, st.uuids().map(str), st.sampled_from(["{id}", " {id} ", "{{id}}", "urn:uuid:{ID}"])),
    offset=HOSTILE,
    as_json=st.booleans(),
)
@example(stream="{id}", offset="--", as_json=False)  # Python 3.11's argparse reads "--from=--" as []
def test_pgstreams_tail_answers_any_text_as_its_arguments_or_says_what_is_wrong(
    stream: str, offset: str, as_json: bool, ended_stream: Stream
) -> None:
    """An ended stream (named in some forms of its id), others' ids, and any text as id and
    offset: its chunks, or a CommandError, never a traceback."""
    stream = stream.replace("{id}", str(ended_stream.id)).replace("{ID}", str(ended_stream.id).upper())
    answered("pgstreams_tail", stream, f"--from={offset}", *(["--json"] if as_json else []))


@settings(max_examples=50, deadline=None)
@given(args=st.lists(st.one_of(HOSTILE, st.sampled_from(["--json", "--j", "-v", "3", "--no-color"])), max_size=3))
def test_pgstreams_stats_answers_any_text_as_its_arguments_or_says_what_is_wrong(args: list[str]) -> None:
    answered("pgstreams_stats", *args)


def test_prune_deletes_what_points_at_a_stream_as_django_does() -> None:
    """The demo's Conversation points at its answer's stream (on_delete CASCADE): prune's raw
    delete failed at the commit (a foreign key still referenced it); Django's delete takes the
    conversation with it."""
    from django.contrib.auth import get_user_model

    from demo_project.chat.models import Conversation

    user = get_user_model().objects.create_user("asker")
    stream = pgstreams.create_stream()
    pgstreams.write_many(stream.id, ["a", "b"])
    pgstreams.close(stream.id)
    Conversation.objects.create(user=user, prompt="p", stream=stream)
    Stream.objects.filter(pk=stream.pk).update(closed_at=timezone.now() - datetime.timedelta(days=30))
    done = maintenance.prune(maintenance.parse_cutoff("7d"))
    assert (done.streams, done.chunks) == (1, 2)
    assert not Stream.objects.filter(pk=stream.pk).exists() and not Chunk.objects.filter(stream_id=stream.pk).exists()
    assert not Conversation.objects.filter(user=user).exists()


@contextlib.contextmanager
def kept_by_the_project(using: str = "default") -> Iterator[type[models.Model]]:
    """A project's model that keeps a stream, made for the block in the database ``using``:
    ``Pin(stream=FK(Stream, on_delete=PROTECT))``. Neither the test settings nor the demo have one."""

    class Pin(models.Model):
        stream = models.ForeignKey(Stream, on_delete=models.PROTECT, related_name="+")

        class Meta:
            app_label = "chat"

    with connections[using].schema_editor() as editor:
        editor.create_model(Pin)
    try:
        yield Pin
    finally:
        with connections[using].schema_editor() as editor:
            editor.delete_model(Pin)
        apps.all_models["chat"].pop("pin", None)
        apps.clear_cache()


def test_prune_of_a_stream_a_protect_keeps_leaves_it_whole_though_larger_than_a_batch() -> None:
    """Its chunks went in slices, each committed, before Django's delete of its row found the
    PROTECT: the prune stopped as documented, and the stream it kept had lost all 300 chunks."""
    s = closed_stream(300, closed_days_ago=30)
    with kept_by_the_project() as pin:
        pin.objects.create(stream=s)
        with pytest.raises(ProtectedError):
            maintenance.prune(maintenance.parse_cutoff("7d"), batch=100)
        with pytest.raises(CommandError, match="kept by objects of the project"):
            run("pgstreams_prune", "--closed-before", "7d", "--batch", "100")
        assert Chunk.objects.filter(stream_id=s.pk).count() == 300
        assert Stream.objects.get(pk=s.pk).deleted_at is None


def test_prune_of_a_stream_with_forks_a_protect_keeps_stops_without_tombstoning_it() -> None:
    """A closed source with a fork was made a tombstone by raw SQL, never asking its on_delete: its
    chunks deleted and its path answering 410 although a PROTECT keeps it."""
    from django.test import Client, override_settings

    endpoint = "/pgstreams/v1/stream/"
    client = Client()
    with override_settings(PGSTREAMS=FORKS_OPEN):
        client.put(f"{endpoint}kept/source", "kept", content_type="text/plain")
        assert client.put(f"{endpoint}kept/fork", headers={"Stream-Forked-From": "kept/source"}).status_code == 201
    source = Stream.objects.get(path="kept/source")
    pgstreams.close(source.id)
    Stream.objects.filter(pk=source.pk).update(closed_at=timezone.now() - datetime.timedelta(days=30))
    with kept_by_the_project() as pin:
        pin.objects.create(stream=source)
        with pytest.raises(ProtectedError):
            maintenance.prune(maintenance.parse_cutoff("7d"))
        source.refresh_from_db()
        assert source.deleted_at is None and Chunk.objects.filter(stream_id=source.pk).count() == 1
        with override_settings(PGSTREAMS=FORKS_OPEN):
            assert client.get(f"{endpoint}kept/source").content == b"kept"


def test_prune_lets_a_projects_post_delete_receiver_take_longer_than_the_idle_bound() -> None:
    """Django's delete runs the project's receivers inside prune's transaction (and an expired
    stream's removal's), which carried the idle bound (half of QUERY_TIMEOUT): a receiver that
    spent longer outside the database (a call to object storage, say) had the session ended
    under it ("terminating connection due to idle-in-transaction timeout")."""
    closed = closed_stream(1, closed_days_ago=30)
    expired = pgstreams.create_stream(path="slow/expired")
    Stream.objects.filter(pk=expired.pk).update(ttl=60, used_at=timezone.now() - datetime.timedelta(hours=1))
    seen = []

    def receiver(sender: type[Stream], instance: Stream, **kwargs: Any) -> None:
        time.sleep(db.idle_bound() + 0.5)
        seen.append(instance.pk)

    post_delete.connect(receiver, sender=Stream, dispatch_uid="slow-receiver")
    try:
        assert maintenance.prune(maintenance.parse_cutoff("7d")).streams == 1
        assert maintenance.prune_expired() == 1
    finally:
        post_delete.disconnect(sender=Stream, dispatch_uid="slow-receiver")
    assert seen == [closed.pk, expired.pk]
    assert not Stream.objects.filter(pk__in=seen).exists()
