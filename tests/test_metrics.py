"""The metrics view's access rule, and that its figures move when chunks are written and delivered."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from django.test import AsyncClient, Client, override_settings
from prometheus_client import REGISTRY

import pgstreams

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/pgstreams/metrics/"
TOKEN = "a-long-enough-metrics-token"


def value(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_only_staff_or_the_token_bearer_may_scrape() -> None:
    users = get_user_model().objects
    plain, staff = Client(), Client()
    plain.force_login(users.create_user("plain"))
    staff.force_login(users.create_user("staff", is_staff=True))
    assert Client().get(URL).status_code == 401
    assert plain.get(URL).status_code == 401
    response = staff.get(URL)
    assert response.status_code == 200 and b"pgstreams_chunks_written_total" in response.content
    assert Client().get(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401  # no token set
    with override_settings(PGSTREAMS={"METRICS_TOKEN": TOKEN}):
        assert Client().get(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert Client().get(URL, headers={"Authorization": "Bearer wrong-token-wrong-token"}).status_code == 401


def test_writes_flushes_readers_and_deliveries_are_counted() -> None:
    written, flushes = value("pgstreams_chunks_written_total"), value("pgstreams_flushes_total")
    s = pgstreams.create_stream()
    pgstreams.write(s.id, "a")
    pgstreams.write_many(s.id, ["b", "c"])
    assert value("pgstreams_chunks_written_total") == written + 3
    deadline = time.monotonic() + 5
    while value("pgstreams_flushes_total") == flushes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert value("pgstreams_flushes_total") > flushes
    assert value("pgstreams_flush_batch_streams_count") >= 1

    batches = value("pgstreams_append_batch_chunks_count")
    pgstreams.append(s.id, "d")
    assert value("pgstreams_chunks_written_total") == written + 4
    assert value("pgstreams_append_batch_chunks_count") == batches + 1

    readers = value("pgstreams_active_readers")
    reader = pgstreams.read(s.id, timeout=5)
    assert next(reader).data == "a"
    assert value("pgstreams_active_readers") == readers + 1
    reader.close()
    assert value("pgstreams_active_readers") == readers


async def test_sse_deliveries_are_timed() -> None:
    delivered = value("pgstreams_delivery_seconds_count")
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, ["x", "y"])
    await pgstreams.aclose(s.id)
    response = await AsyncClient().get(f"/pgstreams/streams/{s.id}/events")
    body = b"".join([part async for part in response.streaming_content])
    assert b"event: end" in body
    assert value("pgstreams_delivery_seconds_count") == delivered + 2
    assert value("pgstreams_sse_clients") == 0


async def test_an_sse_response_cut_at_its_budget_lets_go_of_its_reader_at_once(monkeypatch) -> None:
    from pgstreams import views

    monkeypatch.setattr(views, "RESPONSE_BYTES", 500)
    s = await pgstreams.acreate_stream()
    await pgstreams.awrite_many(s.id, ["x" * 100] * 20)  # the stream stays open
    readers = value("pgstreams_active_readers")
    response = await AsyncClient().get(f"/pgstreams/streams/{s.id}/events")
    body = b"".join([part async for part in response.streaming_content])
    assert b"event: end" not in body  # cut by the budget: the client would resume
    assert value("pgstreams_active_readers") == readers
