"""Durable Streams appends on the append path (``pgstreams.durable.appends``): requests that share
a batch each answered as the protocol says, the paths a process remembers never leading a write
astray (a path deleted and made again, an expired stream, an owner changed, a fork), a stream
held by another transaction holding up only its own appends, and closes announced; plain creates
in the same batches."""

from __future__ import annotations

import asyncio
import datetime
import time

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db.models.signals import post_save, pre_save
from django.test import AsyncClient, override_settings
from django.utils import timezone

import pgstreams
from pgstreams import appender, conf, db, signals
from pgstreams.durable import appends, wire
from pgstreams.models import Chunk, Stream
from tests.helpers import appender_held

pytestmark = pytest.mark.django_db(transaction=True)

EVERYONE = "demo_project.chat.durable.allow_everything"


@pytest.fixture(autouse=True)
def no_paths_remembered() -> None:
    """Each test starts with no path remembered: the database is emptied between tests, and a
    stream remembered from an earlier one would send a first append round a second time."""
    appends._paths.get().streams.clear()


@pytest.fixture
def found(monkeypatch) -> list[str]:
    """The paths appends looked up (``store.find`` on a thread), in order."""
    paths: list[str] = []
    real_find = appends._find

    async def counted_find(*args, **kwargs):
        paths.append(args[1])
        return await real_find(*args, **kwargs)

    monkeypatch.setattr(appends, "_find", counted_find)
    return paths


def url(path: str) -> str:
    return f"/pgstreams/v1/stream/{path}"


async def post(client: AsyncClient, path: str, body: str, content_type: str = "text/plain", **headers: str):
    return await client.post(url(path), body, content_type=content_type, headers=headers)


def producer(pid: str, epoch: int, seq: int) -> dict[str, str]:
    return {"Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


async def stored(path: str) -> list[str | bytes]:
    return [c.data async for c in Chunk.objects.filter(stream__path=path).order_by("offset")]


def owners_only(request, action: str, path: str, stream) -> bool:
    """Writes by the stream's owner; anyone may create."""
    return action == "create" or (stream is not None and stream.owner_id == request.user.id)


async def test_requests_that_share_a_batch_are_each_answered_as_the_protocol_says() -> None:
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
        for path in ("a", "c", "s", "p", "k", "h"):
            await pgstreams.acreate_stream(path=path)
        await pgstreams.acreate_stream(path="j", content_type="application/json")
        await post(client, "c", "last", **{"Stream-Closed": "true"})
        await post(client, "s", "first", **{"Stream-Seq": "005"})
        first = await post(client, "p", "d", **producer("p1", 1, 0))
        assert first.status_code == 200, first.content
        before = appender.appender(conf.database()).stats.snapshot()
        requests = {
            "append": post(client, "a", "x"),
            "to a closed stream": post(client, "c", "x"),
            "of another content type": post(client, "a", "[1]", content_type="application/json"),
            "with an old Stream-Seq": post(client, "s", "z", **{"Stream-Seq": "004"}),
            "with a new Stream-Seq": post(client, "s", "z", **{"Stream-Seq": "006"}),
            "a producer's duplicate": post(client, "p", "d", **producer("p1", 1, 0)),
            "a fenced producer": post(client, "p", "e", **producer("p1", 0, 1)),
            "a producer's gap": post(client, "p", "f", **producer("p1", 1, 5)),
            "a producer's next": post(client, "p", "g", **producer("p1", 1, 1)),
            "two JSON values": post(client, "j", "[1, 2]", content_type="application/json"),
            "no JSON": post(client, "j", "[", content_type="application/json"),
            "a close": post(client, "k", "", **{"Stream-Closed": "true"}),
        }
        with appender_held() as held:  # the requests queue behind a held batch: the next has them all
            hold = asyncio.ensure_future(post(client, "h", "held"))
            await held.waiting()
            answered = asyncio.gather(*requests.values())
            await held.queued(len(requests))
        assert (await hold).status_code == 204
        answers = dict(zip(requests, await answered, strict=True))
        batches = (appender.appender(conf.database()).stats - before).batches
    statuses = {name: answer.status_code for name, answer in answers.items()}
    print(f"{len(requests)} requests queued behind a held batch, committed in {batches - 1}: {statuses}")
    assert statuses == {
        "append": 204,
        "to a closed stream": 409,
        "of another content type": 409,
        "with an old Stream-Seq": 409,
        "with a new Stream-Seq": 204,
        "a producer's duplicate": 204,
        "a fenced producer": 403,
        "a producer's gap": 409,
        "a producer's next": 200,
        "two JSON values": 204,
        "no JSON": 400,
        "a close": 204,
    }
    assert batches == 2
    assert answers["to a closed stream"]["Stream-Closed"] == "true"
    assert answers["a fenced producer"]["Producer-Epoch"] == "1"
    assert answers["a producer's gap"]["Producer-Expected-Seq"] in ("1", "2")  # before or after "next"
    assert (answers["a producer's next"]["Producer-Epoch"], answers["a producer's next"]["Producer-Seq"]) == ("1", "1")
    assert answers["two JSON values"]["Stream-Next-Offset"] == wire.format_offset(2)
    assert await stored("p") == ["d", "g"] and await stored("j") == ["1", "2"] and await stored("s") == ["first", "z"]
    assert await stored("a") == ["x"] and (await Stream.objects.aget(path="k")).is_closed


async def test_a_path_deleted_and_made_again_is_written_in_its_new_stream() -> None:
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
        await pgstreams.acreate_stream(path="again")
        assert (await post(client, "again", "old")).status_code == 204  # remembered now
        await Stream.objects.filter(path="again").adelete()  # by another process, say
        made = await pgstreams.acreate_stream(path="again")
        assert (await post(client, "again", "new")).status_code == 204
    assert [c.data async for c in Chunk.objects.filter(stream=made)] == ["new"]


async def test_an_expired_stream_is_not_written_through_the_path_remembered() -> None:
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
        await client.put(url("brief"), "x", content_type="text/plain", headers={"Stream-TTL": "60"})
        assert (await post(client, "brief", "a")).status_code == 204
        stream = await Stream.objects.aget(path="brief")
        await Stream.objects.filter(pk=stream.pk).aupdate(used_at=timezone.now() - datetime.timedelta(hours=1))
        answer = await post(client, "brief", "b")
    assert answer.status_code == 404
    assert not await Chunk.objects.filter(stream_id=stream.pk, data="b").aexists()


async def test_a_stream_given_another_owner_is_not_written_by_its_old_one() -> None:
    users = get_user_model().objects
    first, second = [await sync_to_async(users.create_user)(name) for name in ("first", "second")]
    client = AsyncClient()
    await client.aforce_login(first)
    await pgstreams.acreate_stream(path="owned", owner=first)
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_durable_appends.owners_only"}):
        assert (await post(client, "owned", "mine")).status_code == 204
        await Stream.objects.filter(path="owned").aupdate(owner=second)
        answer = await post(client, "owned", "not mine any more")
    assert answer.status_code == 403
    assert await stored("owned") == ["mine"]


async def test_an_append_in_flight_while_its_stream_is_handed_to_another_owner_is_asked_again(found) -> None:
    """Bob's append looked its stream up afresh (no path remembered) while a transaction that
    hands the stream to alice held its row: once that commits, the batch that locks the row finds
    a new owner and the rule is asked again, as for a remembered path (403, nothing stored)."""
    users = get_user_model().objects
    bob, alice = [await sync_to_async(users.create_user)(name) for name in ("bob", "alice")]
    client = AsyncClient()
    await client.aforce_login(bob)
    stream = await pgstreams.acreate_stream(path="handed", owner=bob)
    await pgstreams.acreate_stream(path="free")
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_durable_appends.owners_only"}):
        handing = await psycopg.AsyncConnection.connect(**db.connect_kwargs("default", "test-handing"))
        await handing.execute("BEGIN")
        await handing.execute("UPDATE pgstreams_stream SET owner_id = %s WHERE id = %s", [alice.pk, stream.pk])
        try:
            sent = asyncio.create_task(post(client, "handed", "bob's line"))
            deadline = time.monotonic() + 10
            while found != ["handed"]:  # bounded: 10 s
                assert time.monotonic() < deadline, "the append never looked its stream up"
                await asyncio.sleep(0.01)
            await pgstreams.aappend((await Stream.objects.aget(path="free")).id, "a later batch")
            assert not sent.done()  # its batch met the held row: it waits
            await handing.execute("COMMIT")
        finally:
            await handing.close()
        answer = await asyncio.wait_for(sent, 10)
    assert answer.status_code == 403, answer.content
    assert await stored("handed") == [] and found == ["handed", "handed"]


async def owners_only_on_the_loop(request, action: str, path: str, stream) -> bool:
    """owners_only as an ``async def`` rule."""
    user = await request.auser()
    return action == "create" or (stream is not None and stream.owner_id == user.id)


async def test_an_async_rule_is_awaited_and_an_owners_small_appends_to_a_remembered_stream_hold_no_thread(
    found: list[str],
) -> None:
    """Appends to a stream the process remembers, with an ``async def`` rule and a body of at
    most LOOP_BODY_BYTES, are judged on the event loop: no lookup on a thread. The first append
    and a larger body go through the thread; a stranger, and the old owner of a stream given to
    another, are refused and write nothing."""
    users = get_user_model().objects
    first, second = [await sync_to_async(users.create_user)(name) for name in ("first", "second")]
    owner, stranger = AsyncClient(), AsyncClient()
    await owner.aforce_login(first)
    await stranger.aforce_login(second)
    await pgstreams.acreate_stream(path="owned", owner=first)
    large = "x" * (appends.LOOP_BODY_BYTES + 1)
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_durable_appends.owners_only_on_the_loop"}):
        answers = [await post(owner, "owned", body) for body in ("a", "b", "c")]
        assert len(found) == 1  # the first append looked the path up; the others remembered it
        answers.append(await post(owner, "owned", large))
        assert len(found) == 2
        refused = await post(stranger, "owned", "not yours")
        await Stream.objects.filter(path="owned").aupdate(owner=second)
        refused_since = await post(owner, "owned", "not mine any more")
    assert [a.status_code for a in answers] == [204] * 4
    assert (refused.status_code, refused_since.status_code) == (403, 403)
    assert await stored("owned") == ["a", "b", "c", large]


async def test_a_stream_made_by_a_plain_put_takes_its_first_append_without_a_lookup(found: list[str]) -> None:
    """A client's PUT then POST: the create remembers its stream, so the append needs no thread's
    hop and no query to find it; and the batch still checks it, as for any remembered stream."""
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
        assert (await put(client, "fresh")).status_code == 201
        assert (await post(client, "fresh", "first")).status_code == 204
        assert found == []
        await Stream.objects.filter(path="fresh").adelete()  # by another process, say
        made = await pgstreams.acreate_stream(path="fresh")
        assert (await post(client, "fresh", "second")).status_code == 204
    assert found == ["fresh"]  # the stream it remembered was gone: looked up again
    assert [c.data async for c in Chunk.objects.filter(stream=made)] == ["second"]


class RefusesWritesAsynchronously:
    """A rule whose ``__call__`` is ``async def``: a coroutine function to no check of the
    callable itself, whose answer must still be awaited, not taken as true."""

    async def __call__(self, request, action: str, path: str, stream) -> bool:
        return action in ("create", "read")


refuses_writes_asynchronously = RefusesWritesAsynchronously()


async def test_a_rule_object_with_an_async_call_is_awaited_and_its_refusal_kept() -> None:
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_durable_appends.refuses_writes_asynchronously"}):
        created = await client.put(url("guarded"), headers={"Content-Type": "text/plain"})
        answers = [await post(client, "guarded", body) for body in ("a", "b")]
    assert created.status_code == 201
    assert [a.status_code for a in answers] == [403, 403]
    assert await stored("guarded") == []


async def put(client: AsyncClient, path: str, content_type: str = "text/plain", body: str = ""):
    if body:
        return await client.put(url(path), body, content_type=content_type)
    return await client.put(url(path), headers={"Content-Type": content_type})  # else none is sent


async def test_plain_creates_share_a_batch_with_appends_and_a_taken_path_or_a_body_goes_the_long_way() -> None:
    """PUTs with no body, fork or close are committed by the appender, in the batch of the appends
    in flight; a taken path (a stream with the same or another configuration, an expired one)
    writes nothing there and is answered the long way, as is a PUT with a body."""
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
        for path in ("h", "appended", "taken"):
            await pgstreams.acreate_stream(path=path, content_type="text/plain")
        expired = await pgstreams.acreate_stream(path="expired", content_type="text/plain")
        an_hour_ago = timezone.now() - datetime.timedelta(hours=1)
        await Stream.objects.filter(pk=expired.pk).aupdate(ttl=1, used_at=an_hour_ago)
        requests = {
            "new": put(client, "new/1"),
            "another new": put(client, "new/2", "application/json"),
            "the same again": put(client, "taken"),
            "another configuration": put(client, "taken", "application/json"),
            "an expired stream's path": put(client, "expired"),
            "an append": post(client, "appended", "x"),
        }
        with appender_held() as held:
            hold = asyncio.ensure_future(post(client, "h", "held"))
            await held.waiting()
            before = appender.appender(conf.database()).stats.snapshot()
            answered = asyncio.gather(*requests.values())
            await held.queued(len(requests))
        assert (await hold).status_code == 204
        answers = dict(zip(requests, await answered, strict=True))
        batches = (appender.appender(conf.database()).stats - before).batches
        with_body = await put(client, "with/body", body="hello")
    statuses = {name: answer.status_code for name, answer in answers.items()}
    print(f"{len(requests)} requests queued behind a held batch, committed in {batches - 1}: {statuses}")
    assert statuses == {
        "new": 201,
        "another new": 201,
        "the same again": 200,
        "another configuration": 409,
        "an expired stream's path": 201,
        "an append": 204,
    }
    assert batches == 2  # the held one, and one for the six (then the taken paths the long way)
    assert answers["new"]["Location"].endswith(url("new/1"))
    assert (await Stream.objects.aget(path="new/2")).content_type == "application/json"
    assert (await Stream.objects.aget(path="expired")).id != expired.id
    assert with_body.status_code == 201, with_body.content
    assert await stored("with/body") == ["hello"]
    assert await stored("appended") == ["x"]


async def test_a_plain_create_is_owned_by_the_signed_in_user_under_an_async_rule_and_a_plain_one() -> None:
    user = await sync_to_async(get_user_model().objects.create_user)("maker")
    client = AsyncClient()
    await client.aforce_login(user)
    for rule in ("owners_only_on_the_loop", "owners_only"):
        with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": f"tests.test_durable_appends.{rule}"}):
            assert (await put(client, f"made/{rule}")).status_code == 201
            assert (await post(client, f"made/{rule}", "mine")).status_code == 204
    owners = [s.owner_id async for s in Stream.objects.filter(path__startswith="made/")]
    assert owners == [user.id, user.id]


async def test_a_plain_create_sends_post_save_and_a_pre_save_receiver_still_shapes_the_row() -> None:
    """Django's signals for a stream's creation come with a plain create as with the ORM's save:
    post_save once, created=True, on a thread (its receiver may query); a pre_save receiver's
    change to the row is kept (the ORM's save makes it)."""
    client = AsyncClient()
    saved = []

    def on_post_save(sender, instance, created, using, **kwargs) -> None:
        saved.append((instance.path, created, using, Stream.objects.filter(pk=instance.pk).exists()))

    def on_pre_save(sender, instance, **kwargs) -> None:
        instance.label = "labelled by pre_save"

    post_save.connect(on_post_save, sender=Stream)
    try:
        with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
            assert (await put(client, "signalled")).status_code == 201
            pre_save.connect(on_pre_save, sender=Stream)
            try:
                assert (await put(client, "labelled")).status_code == 201
            finally:
                pre_save.disconnect(on_pre_save, sender=Stream)
    finally:
        post_save.disconnect(on_post_save, sender=Stream)
    assert saved == [("signalled", True, "default", True), ("labelled", True, "default", True)]
    assert (await Stream.objects.aget(path="labelled")).label == "labelled by pre_save"


async def test_a_plain_create_that_waits_on_another_transaction_undoes_only_its_batchs_creates() -> None:
    """Another connection has inserted a stream at `busy` and not committed. The batch that tries
    to create it there too waits at most LOCK_WAIT, then undoes its creates alone: the append in
    the same batch commits, the create of a free path is made the long way, and the create at
    `busy` compares with the other's stream once it commits."""
    client = AsyncClient()
    holder = await psycopg.AsyncConnection.connect(**db.connect_kwargs("default", "test-holder"))
    await holder.execute("BEGIN")
    await holder.execute(
        "INSERT INTO pgstreams_stream (id, created_at, next_offset, label, metadata, path, content_type)"
        " VALUES (gen_random_uuid(), now(), 0, '', '{}', 'busy', 'text/plain')"
    )
    try:
        with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
            for path in ("h", "a"):
                await pgstreams.acreate_stream(path=path, content_type="text/plain")
            with appender_held() as held:
                hold = asyncio.ensure_future(post(client, "h", "held"))
                await held.waiting()
                busy = asyncio.ensure_future(put(client, "busy"))
                batch_mates = asyncio.gather(put(client, "free"), post(client, "a", "x"))
                await held.queued(3)
            assert (await hold).status_code == 204
            free, append = await asyncio.wait_for(batch_mates, 5)
            assert not busy.done()  # still waiting on `busy`, holding no batch
            await holder.execute("COMMIT")
            waited = await asyncio.wait_for(busy, 10)
    finally:
        await holder.close()
    assert (free.status_code, append.status_code, waited.status_code) == (201, 204, 200)
    assert await stored("a") == ["x"]
    assert await Stream.objects.filter(path__in=["busy", "free"]).acount() == 2


async def test_a_plain_create_whose_owner_is_deleted_meanwhile_fails_alone_and_at_once() -> None:
    """The user is deleted while their PUT waits for its batch: the stream's key to them is
    checked in the inserts' savepoint, not at the COMMIT, so the append that shares the batch
    commits at once (a failure at the COMMIT had the appender send the batch again until its
    retry budget ran out, and fail every append in it)."""
    user = await sync_to_async(get_user_model().objects.create_user)("leaving")
    client, other = AsyncClient(), AsyncClient()
    await client.aforce_login(user)
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
        for path in ("hold/3", "mate/3"):
            await pgstreams.acreate_stream(path=path, content_type="text/plain")
        before = appender.appender(conf.database()).stats.snapshot()
        with appender_held() as held:
            hold = asyncio.ensure_future(post(other, "hold/3", "held"))
            await held.waiting()
            create = asyncio.ensure_future(put(client, "orphan"))
            mate = asyncio.ensure_future(post(other, "mate/3", "x"))
            await held.queued(2)
            await user.adelete()
        started = time.monotonic()
        appended = await asyncio.wait_for(mate, 5)
        took = time.monotonic() - started
        created = await asyncio.wait_for(create, 10)
        assert (await hold).status_code == 204
        retries = (appender.appender(conf.database()).stats - before).retries
    print(f"the batch-mate answered {took * 1000:.0f} ms after the release; the create {created.status_code}")
    assert appended.status_code == 204 and retries == 0
    assert await stored("mate/3") == ["x"]
    orphan = await Stream.objects.filter(path="orphan").afirst()
    assert created.status_code != 201 or (orphan is not None and orphan.owner_id is None)


async def test_a_fork_and_its_source_each_get_their_own_appends_and_a_deleted_source_answers_410() -> None:
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
        await client.put(url("source"), "a", content_type="text/plain")
        assert (await post(client, "source", "b")).status_code == 204
        await client.put(url("fork"), headers={"Stream-Forked-From": "source"})
        assert (await post(client, "fork", "f")).status_code == 204
        assert (await post(client, "source", "c")).status_code == 204
        assert (await client.delete(url("source"))).status_code == 204  # a tombstone stays: the fork lives
        gone = await post(client, "source", "d")
    assert gone.status_code == 410
    assert (await client.get(url("fork"))).content == b"abf"
    assert await stored("fork") == ["a", "b", "f"]


async def test_a_stream_held_by_another_transaction_holds_up_only_its_own_appends() -> None:
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
        held = await pgstreams.acreate_stream(path="held")
        await pgstreams.acreate_stream(path="free")
        holder = await psycopg.AsyncConnection.connect(**db.connect_kwargs("default", "test-holder"))
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM pgstreams_stream WHERE id = %s FOR UPDATE", [held.id])
        try:
            waiting = asyncio.create_task(post(client, "held", "h"))
            free = [await post(client, "free", f"{i}") for i in range(3)]
            python = await pgstreams.aappend((await Stream.objects.aget(path="free")).id, "3")
            assert not waiting.done()  # the lock is still held: its append waits for a later batch
        finally:
            await holder.execute("ROLLBACK")
            await holder.close()
        answer = await asyncio.wait_for(waiting, 10)
    assert [a.status_code for a in free] == [204] * 3 and python == 3
    assert answer.status_code == 204 and await stored("held") == ["h"]


async def test_a_close_over_http_sends_stream_closed_once_it_commits() -> None:
    heard: list[tuple[str, int]] = []

    def closed(sender, stream_id, next_offset, using, **kwargs) -> None:
        heard.append((str(stream_id), next_offset))

    signals.stream_closed.connect(closed)
    try:
        client = AsyncClient()
        with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
            await client.put(url("ending"), "a", content_type="text/plain")
            await post(client, "ending", "b", **{"Stream-Closed": "true"})
            await post(client, "ending", "", **{"Stream-Closed": "true"})  # closed already: no second signal
    finally:
        signals.stream_closed.disconnect(closed)
    stream = await Stream.objects.aget(path="ending")
    assert heard == [(str(stream.id), 2)]


def test_an_append_retried_as_the_same_producer_returns_none_and_stores_once() -> None:
    s = pgstreams.create_stream()
    batch = pgstreams.Producer("writer-1", 0, 0)
    assert pgstreams.append(s.id, "once", producer=batch) == 0

    async def again() -> int | None:
        return await asyncio.wait_for(pgstreams.aappend(s.id, "once", producer=batch), 10)

    assert asyncio.run(again()) is None
    assert pgstreams.append(s.id, "twice", producer=pgstreams.Producer("writer-1", 0, 1)) == 1
    assert list(Chunk.objects.filter(stream_id=s.id).order_by("offset").values_list("data", flat=True)) == [
        "once",
        "twice",
    ]


async def test_an_append_past_one_batch_is_refused_whole(monkeypatch) -> None:
    """An append is committed whole in one batch of the append path, so a body is at most one
    batch (APPEND_BATCH chunks). A 2.4 MB JSON array of 1.2 million values was one appender
    item whatever APPEND_BATCH said: it answered 503 after 12 s, left 169 MB of rows that did
    not commit, and held up other streams' appends for 5 s."""
    client = AsyncClient()
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE}):
        await pgstreams.acreate_stream(path="j", content_type="application/json")
        answer = await post(client, "j", "[" + ",".join(["1"] * 1_200_000) + "]", "application/json")
        assert answer.status_code == 413, answer.content
        assert b"1200000 values is over one append's 10000 (PGSTREAMS['APPEND_BATCH'])" in answer.content
        assert await stored("j") == []
        answer = await post(client, "j", "[" + ",".join(["2"] * 10_000) + "]", "application/json")
        assert answer.status_code == 204 and await stored("j") == ["2"] * 10_000
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": EVERYONE, "APPEND_BATCH": 2, "MAX_CHUNK_BYTES": 4}):
        await pgstreams.acreate_stream(path="t")
        answer = await post(client, "t", "123456789")  # three chunks of at most 4 bytes
        assert answer.status_code == 413 and b"makes 3 chunks" in answer.content
        answer = await put(client, "new", body="123456789")  # a create's body is one append too
        assert answer.status_code == 413 and b"makes 3 chunks" in answer.content
        assert await stored("t") == [] and not await Stream.objects.filter(path="new").aexists()
        assert (await post(client, "t", "12345678")).status_code == 204 and await stored("t") == ["1234", "5678"]
        monkeypatch.setattr(appender, "BATCH_BYTES", 6)  # 8 MiB: more than a body holds by default
        answer = await post(client, "t", "1234567")
        assert answer.status_code == 413 and b"holds 7 characters or bytes of data" in answer.content
        assert await stored("t") == ["1234", "5678"]
