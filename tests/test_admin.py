"""The admin: staff only, a changelist whose query count does not grow with the streams, the
stream page's text, chunk pages and live tail, and the close and delete actions."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

import pgstreams
from pgstreams.models import Chunk, Stream

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(user)
    return client


def test_only_staff_see_streams() -> None:
    s = pgstreams.create_stream(label="secret")
    anonymous = Client()
    response = anonymous.get(reverse("admin:pgstreams_stream_changelist"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    user = get_user_model().objects.create_user("plain", password="pw")
    client = Client()
    client.force_login(user)
    assert client.get(reverse("admin:pgstreams_stream_change", args=[s.pk])).status_code == 302


def test_the_admin_and_the_endpoints_let_the_same_users_read_others_streams() -> None:
    from django.contrib.auth.models import Permission

    from pgstreams.auth import default_authorize

    owner = get_user_model().objects.create_user("owner", password="pw")
    s = pgstreams.create_stream(owner=owner)
    url = reverse("admin:pgstreams_stream_change", args=[s.pk])
    staff = get_user_model().objects.create_user("staff", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get(url).status_code == 403 and not default_authorize(staff, s)
    staff.user_permissions.add(Permission.objects.get(codename="view_stream"))
    staff = get_user_model().objects.get(pk=staff.pk)
    assert client.get(url).status_code == 200 and default_authorize(staff, s)


def test_deleting_a_stream_in_the_admin_needs_leave_to_read_it_too() -> None:
    """Staff with delete_stream alone were shown a stream's label on the delete page, and could
    delete it, though they may not read it."""
    from django.contrib.auth.models import Permission

    s = pgstreams.create_stream(label="someone's secret")
    url = reverse("admin:pgstreams_stream_delete", args=[s.pk])
    staff = get_user_model().objects.create_user("staff", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="delete_stream"))
    client = Client()
    client.force_login(staff)
    page = client.get(url)
    assert page.status_code == 403 and b"secret" not in page.content
    assert client.post(url, {"post": "yes"}).status_code == 403 and Stream.objects.filter(pk=s.pk).exists()
    staff.user_permissions.add(Permission.objects.get(codename="view_stream"))
    assert client.get(url).status_code == 200
    assert client.post(url, {"post": "yes"}).status_code == 302 and not Stream.objects.filter(pk=s.pk).exists()


def test_chunks_are_not_in_the_admin(staff: Client) -> None:
    index = staff.get("/admin/").content.decode()
    assert "/admin/pgstreams/stream/" in index and "/admin/pgstreams/chunk/" not in index
    assert staff.get("/admin/pgstreams/stream/add/").status_code == 403


def test_changelist_queries_do_not_grow_with_streams_or_chunks(staff: Client, django_assert_max_num_queries) -> None:
    url = reverse("admin:pgstreams_stream_changelist")
    for _ in range(3):
        pgstreams.write_many(pgstreams.create_stream().id, ["x"] * 5)
    with django_assert_max_num_queries(8) as few:
        assert staff.get(url).status_code == 200
    for _ in range(40):
        s = pgstreams.create_stream(label="many")
        pgstreams.write_many(s.id, ["y"] * 20)
    pgstreams.close(s.id)
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = staff.get(url)
    body = response.content.decode()
    assert response.status_code == 200 and "many" in body
    for query in few.captured_queries:
        assert "count(*)" not in query["sql"].lower() or "pgstreams_chunk" not in query["sql"]
    assert staff.get(url + "?state=closed").content.decode().count("closed") >= 1
    assert staff.get(url + f"?q={s.pk}").status_code == 200


def test_stream_page_text_chunk_pages_and_live_tail(staff: Client) -> None:
    s = pgstreams.create_stream(label="answer", metadata={"model": "fake"})
    pgstreams.write_many(s.id, [f"w{i} " for i in range(120)])
    url = reverse("admin:pgstreams_stream_change", args=[s.pk])
    body = staff.get(url).content.decode()
    assert "w0 w1 w2" in body and "w119" in body  # the text
    assert "page 1 of 3" in body and "<td>49</td>" in body and "<td>50</td>" not in body
    assert "pgstreams.js" in body and f"/ws/pgstreams/{s.pk}/" in body  # open: a live tail
    page3 = staff.get(url + "?chunks_page=3").content.decode()
    assert "<td>119</td>" in page3 and "<td>99</td>" not in page3
    assert staff.get(url + "?chunks_page=nonsense").status_code == 200
    assert 'name="_save"' not in body  # nothing to save: every field is read-only
    pgstreams.close(s.id)
    assert "pgstreams.js" not in staff.get(url).content.decode()  # closed: no tail


def test_long_text_is_cut_at_64_kib_with_a_note(staff: Client) -> None:
    s = pgstreams.create_stream()
    pgstreams.write_many(s.id, ["a" * 1000] * 70)
    body = staff.get(reverse("admin:pgstreams_stream_change", args=[s.pk])).content.decode()
    assert "Cut at the first 64 KiB" in body
    assert body.count("a" * 1000) < 70


def test_close_and_delete_actions(staff: Client) -> None:
    a, b = pgstreams.create_stream(), pgstreams.create_stream()
    pgstreams.write_many(b.id, ["x"] * 3)
    url = reverse("admin:pgstreams_stream_changelist")
    staff.post(url, {"action": "close_streams", "_selected_action": [str(a.pk), str(b.pk)]})
    assert Stream.objects.filter(closed_at__isnull=True).count() == 0
    staff.post(url, {"action": "delete_selected", "_selected_action": [str(b.pk)], "post": "yes"})
    assert not Stream.objects.filter(pk=b.pk).exists() and not Chunk.objects.filter(stream_id=b.pk).exists()


def test_the_stream_page_reads_its_text_in_one_query_however_many_chunks_are_empty(staff: Client) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries(stream_id) -> int:
        with CaptureQueriesContext(connection) as captured:
            body = staff.get(reverse("admin:pgstreams_stream_change", args=[stream_id])).content.decode()
        assert "tail text" in body
        return len(captured.captured_queries)

    short = pgstreams.create_stream()
    pgstreams.write(short.id, "tail text")
    sparse = pgstreams.create_stream()
    pgstreams.write_many(sparse.id, [""] * 3000 + ["tail text"])
    queries(short.id)  # the first request also fills process-wide caches
    assert queries(sparse.id) == queries(short.id)


def test_deleting_a_stream_with_forks_in_the_admin_leaves_a_tombstone_as_a_delete_does(staff: Client) -> None:
    """The admin's delete (its page and its action) removed a source with forks outright, freeing
    its path; a Durable Streams DELETE keeps it taken (410, and 409 for a PUT) until its forks go."""
    from django.test import override_settings

    endpoint = "/pgstreams/v1/stream/"
    anyone = {"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything"}
    with override_settings(PGSTREAMS=anyone):
        for name in ("one", "two"):
            staff.put(f"{endpoint}admin/{name}", "inherited", content_type="text/plain")
            staff.put(f"{endpoint}admin/{name}-fork", headers={"Stream-Forked-From": f"admin/{name}"})
    one, two = Stream.objects.get(path="admin/one"), Stream.objects.get(path="admin/two")
    staff.post(reverse("admin:pgstreams_stream_delete", args=[one.pk]), {"post": "yes"})
    url = reverse("admin:pgstreams_stream_changelist")
    staff.post(url, {"action": "delete_selected", "_selected_action": [str(two.pk)], "post": "yes"})
    for source in (one, two):
        source.refresh_from_db()
        assert source.deleted_at is not None and source.is_closed
        assert not Chunk.objects.filter(stream_id=source.pk).exists()
    with override_settings(PGSTREAMS=anyone):
        assert staff.put(f"{endpoint}admin/one", content_type="text/plain").status_code == 409
        assert staff.head(f"{endpoint}admin/two").status_code == 410
        assert staff.get(f"{endpoint}admin/one-fork").content == b"inherited"
        assert staff.delete(f"{endpoint}admin/one-fork").status_code == 204
    assert not Stream.objects.filter(pk=one.pk).exists()  # the tombstone went with its last fork


def test_deleting_a_stream_in_the_admin_deletes_what_points_at_it_as_its_delete_page_says(staff: Client) -> None:
    """A stream a project's model points at (the demo's Conversation, CASCADE) goes with it, from
    its page and from the action: a tombstone's raw delete once failed at the commit."""
    from demo_project.chat.models import Conversation

    user = get_user_model().objects.create_user("asker")
    turns = [Conversation.objects.create(user=user, prompt=f"p{i}", stream=pgstreams.create_stream()) for i in range(2)]
    first, second = (turn.stream_id for turn in turns)
    assert staff.post(reverse("admin:pgstreams_stream_delete", args=[first]), {"post": "yes"}).status_code == 302
    url = reverse("admin:pgstreams_stream_changelist")
    staff.post(url, {"action": "delete_selected", "_selected_action": [str(second)], "post": "yes"})
    assert not Stream.objects.filter(pk__in=[first, second]).exists()
    assert not Conversation.objects.filter(user=user).exists()
