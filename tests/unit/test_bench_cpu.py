"""Where a delivered token's CPU goes, as the benchmark works it out: each part's seconds per
delivery and their sum, Postgres' CPU with its exited backends counted, and the tables that show
the parts (only for reports that measured them)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from types import SimpleNamespace

import psutil
import pytest

from bench import cpu, fanout, llm, report


@dataclass
class Process:
    """What ``bench.cpu`` asks of a psutil.Process."""

    pid: int
    user: float = 0.0
    system: float = 0.0
    reaped: float = 0.0  # CPU seconds of the children it has waited for
    kids: list[Process] = field(default_factory=list)
    gone: bool = False

    def cpu_times(self) -> SimpleNamespace:
        if self.gone:
            raise psutil.NoSuchProcess(self.pid)
        return SimpleNamespace(user=self.user, system=self.system, children_user=self.reaped, children_system=0.0)

    def children(self, recursive: bool = False) -> list[Process]:
        return [d for k in self.kids for d in [k, *(k.children(True) if recursive else [])]]


def test_each_part_per_delivery_and_their_sum() -> None:
    figures = cpu.per_delivery({"writer": 0.3, "postgres": 0.6, "server": 0.25}, 10_000)
    assert figures == {
        "writer_cpu_us_per_delivery": 30.0,
        "postgres_cpu_us_per_delivery": 60.0,
        "server_cpu_us_per_delivery": 25.0,
        "total_cpu_us_per_delivery": 115.0,
    }


def test_the_sum_is_unknown_unless_every_part_was_measured() -> None:
    figures = cpu.per_delivery({"writer": 0.3, "postgres": None, "server": 0.25}, 10_000)
    assert figures["postgres_cpu_us_per_delivery"] is None and figures["total_cpu_us_per_delivery"] is None
    assert figures["writer_cpu_us_per_delivery"] == 30.0
    nothing = cpu.per_delivery({"writer": 0.3, "postgres": 0.6, "server": 0.25}, 0)
    assert set(nothing.values()) == {None}


def test_the_sum_is_of_the_seconds_not_of_the_rounded_parts() -> None:
    figures = cpu.per_delivery({"writer": 1e-7, "postgres": 1e-7, "server": 1e-7}, 30)  # 0.00333 us each
    assert figures["writer_cpu_us_per_delivery"] == 0.0 and figures["total_cpu_us_per_delivery"] == 0.01


def test_us_per_rounds_to_the_digits_asked() -> None:
    assert cpu.us_per(1.0, 3) == 333333.3 and cpu.us_per(1.0, 3, 2) == 333333.33
    assert cpu.us_per(None, 3) is None and cpu.us_per(1.0, 0) is None


def test_a_process_that_ended_is_left_out_and_one_that_started_since_counts_whole() -> None:
    before = cpu.each([Process(1, 1.0, 0.5), Process(2, 2.0)])
    after = cpu.each([Process(1, 3.0, 0.5), Process(2, gone=True), Process(3, 0.25)], since=before)
    assert after == {1: 2.0, 3: 0.25}


def test_a_tree_is_a_process_and_its_descendants() -> None:
    server = Process(1, 1.0, kids=[Process(2, 0.5, kids=[Process(3, 0.25)]), Process(4, gone=True)])
    assert cpu.tree(server) == 1.75


def test_postgres_counts_a_backend_that_exits_within_the_window() -> None:
    backend, other = Process(10, 2.0, 1.0), Process(11, 4.0)
    postmaster = Process(1, 0.5, reaped=7.0, kids=[backend, other])
    before = cpu.postgres(postmaster)
    assert before == 0.5 + 7.0 + 3.0 + 4.0
    # The backend spends another second, exits and is reaped; the other spends half a second.
    postmaster.kids, postmaster.reaped, other.user = [other], 7.0 + 4.0, 4.5
    assert cpu.postgres(postmaster) - before == pytest.approx(1.5)


def _reader(chunks: int, seconds: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(offset=array("q", range(chunks)), cpu_seconds=seconds)


def test_the_llm_shapes_server_is_its_reader_processes_or_daphne() -> None:
    writers = [SimpleNamespace(cpu_seconds=0.2), SimpleNamespace(cpu_seconds=0.1)]
    readers = [_reader(5000, 0.1), _reader(5000, 0.15)]
    aread = llm._cpu_figures(writers, readers, {"postgres": 0.4})
    assert aread["writer_cpu_us_per_delivery"] == 30.0 and aread["postgres_cpu_us_per_delivery"] == 40.0
    assert aread["server_cpu_us_per_delivery"] == 25.0 and aread["total_cpu_us_per_delivery"] == 95.0
    ws = llm._cpu_figures(writers, [_reader(10_000)], {"postgres": 0.4, "server": 0.5})
    assert ws["server_cpu_us_per_delivery"] == 50.0 and ws["total_cpu_us_per_delivery"] == 120.0
    assert llm._cpu_figures(writers, [], {"postgres": 0.4})["total_cpu_us_per_delivery"] is None  # pace


def _fanout_row(parts: bool) -> dict:
    figures = {
        "connect_s": 1.0,
        "deliveries_per_s": 600.0,
        "e2e_ms": {"p50": 19.5, "p99": 57.0, "max": 83.3},
        "coverage": 1.0,
        "server_cpu_us_per_delivery": 27.3,
    }
    if parts:
        figures.update(writer_cpu_us_per_delivery=30.6, appender_cpu_us_per_delivery=10.3)
        figures.update(postgres_cpu_us_per_delivery=12.0)
        figures["total_cpu_us_per_delivery"] = 69.9
    raw = {**figures, "server_cpu_us_per_delivery": 33.8}
    return {"server": "daphne", "transport": "ws", "shape": "1000x1x30", "pgstreams": figures, "ceiling": raw}


def test_the_fanout_table_shows_the_parts_beside_the_raw_apps_server_when_measured() -> None:
    shown = fanout.table({"runs": [_fanout_row(parts=True)]}).splitlines()
    assert shown[-1].split() == ["daphne", "ws", "1000x1x30", "30.6", "10.3", "12.0", "27.3", "69.9", "33.8"]
    before = _fanout_row(parts=True)  # a report made before the appender was counted apart
    del before["pgstreams"]["appender_cpu_us_per_delivery"]
    assert fanout.table({"runs": [before]}).splitlines()[-1].split()[4] == "-"
    assert "CPU per delivery" not in fanout.table({"runs": [_fanout_row(parts=False)]})


def test_the_llm_table_shows_the_parts_when_measured() -> None:
    row = {
        "method": "stream_writer",
        "tokens_per_stream_s": 30,
        "writer_cpu_us_per_delivery": 30.6,
        "postgres_cpu_us_per_delivery": 12.0,
        "server_cpu_us_per_delivery": 27.3,
        "total_cpu_us_per_delivery": 69.9,
    }
    assert report._llm_cpu([row])[-2].split() == ["stream_writer", "30", "30.6", "12.0", "27.3", "69.9"]
    assert report._llm_cpu([{"method": "stream_writer"}]) == []
