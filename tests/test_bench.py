"""pgstreams_bench in a tiny configuration, so that it keeps working: every mode, the pgbench
ceiling, the WebSocket mode, the replica sweep, the fan-out shapes, the Durable Streams load, the
LLM shape (every write method), the fleet shapes, the storage figures, the JSON and the plot."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from bench import fanout, llm_procs
from pgstreams.models import Stream
from tests.helpers import ROOT, subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]


@pytest.mark.slow
def test_a_tiny_run_of_every_mode(tmp_path, capsys) -> None:
    out, png = tmp_path / "reports" / "out.json", tmp_path / "out.png"  # (its folder made by the run)
    call_command(
        "pgstreams_bench",
        "--mode",
        "all",
        "--writers",
        "4",
        "--duration",
        "1",
        "--readers",
        "1",
        "--fanout",
        "2",
        "--ws",
        "--clients",
        "6",
        "--json",
        str(out),
        "--plot",
        str(png),
    )
    report = json.loads(out.read_text())
    assert set(report) >= {"machine", "config", "pgbench_tps", "runs", "ws", "run"}
    assert report["run"]["kind"] == "modes" and report["run"]["command"] == "call_command()"
    assert report["run"]["date"] and report["run"]["commit"] != "unknown"
    assert [r["mode"] for r in report["runs"]] == ["insert_only", "buffered", "per_write", "off"]
    for run in report["runs"]:
        assert run["written"] > 0 and run["writes_per_s"] > 0
        assert run["duplicates"] == 0 and run["out_of_order"] == 0
        assert set(run["write_ms"]) == {"p50", "p95", "p99", "p999", "max"}
        if run["mode"] == "insert_only":
            assert run["readers"] == 0 and run["coverage"] is None
        else:
            assert run["coverage"] == 1.0
            assert run["reader_backends"] == 2  # one reader process: its listener and its fetcher
            assert set(run["e2e_ms"]) == {"p50", "p95", "p99", "p999", "max"}
    assert report["pgbench_tps"] is None or report["pgbench_tps"] > 0
    ws = report["ws"]
    assert ws["coverage"] == 1.0 and ws["duplicates"] == 0 and ws["errors"] == []
    assert ws["server_peak_mib"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "buffered / per_write" in table and "WebSocket" in table


@pytest.mark.slow
def test_a_tiny_replica_sweep(tmp_path) -> None:
    # In a process of its own: the sweep adds its pair's aliases to settings.DATABASES, which
    # pytest-django forbids inside a database test.
    out, png = tmp_path / "replica.json", tmp_path / "replica.png"
    command = [sys.executable, "manage.py", "pgstreams_bench", "--replica", "--replica-writers", "1,2"]
    command += ["--duration", "0.5", "--readers", "1", "--json", str(out), "--plot", str(png)]
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["runs"] == [] and report["pgbench_tps"] is None
    levels = ["off", "local", "remote_write", "on", "remote_apply"]
    assert [(r["level"], r["writers"]) for r in report["replica"]] == [(x, n) for x in levels for n in (1, 2)]
    for row in report["replica"]:
        assert row["written"] > 0 and row["writes_per_s"] > 0
        assert row["coverage"] == 1.0 and row["duplicates"] == 0 and row["out_of_order"] == 0
        assert set(row["write_ms"]) == set(row["e2e_ms"]) == {"p50", "p95", "p99", "p999", "max"}
        assert 0 <= row["fetches_behind"] <= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "remote_write/on" in done.stdout


@pytest.mark.slow
def test_a_tiny_fanout_run_over_every_transport(tmp_path) -> None:
    """Each transport (the AI SDK's WebSocket chat transport too) delivers every chunk once, in
    order, to every subscriber, measured only once all of them have connected (the connect storm
    is reported apart); the raw ceiling runs beside pgstreams; and a delivery's CPU is given by
    part, writer, Postgres and server."""
    out = tmp_path / "fanout.json"
    command = [sys.executable, "manage.py", "pgstreams_bench", "--fanout-shapes", "2x3x5", "--servers", "daphne"]
    command += ["--transports", "ws,sse,ds-sse,ds-lp,aisdk-ws", "--duration", "1", "--json", str(out)]
    # A long-poll subscriber has connected once its first poll is answered: on a stream with no
    # chunks yet, when the poll times out (the demo's 2 s by default).
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "DEMO_LONG_POLL_TIMEOUT": "0.5"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["transport"] for r in runs] == ["ws", "sse", "ds-sse", "ds-lp", "aisdk-ws"]
    for row in runs:
        for part in ("pgstreams", "ceiling") if row["transport"] in ("ws", "sse", "ds-sse") else ("pgstreams",):
            figures = row[part]
            assert (figures["coverage"], figures["duplicates"], figures["gaps"]) == (1.0, 0, 0), (row, part)
            assert figures["connect_s"] > 0 and figures["errors"] == []
        _cpu_parts_add_up(row["pgstreams"])
    assert "connect s" in done.stdout and "CPU per delivery" in done.stdout


@pytest.mark.slow
def test_the_raw_ceiling_can_run_beside_the_writer(tmp_path) -> None:
    """With --ceiling-writer the raw app delivers every chunk while the shape's writer writes its
    own streams beside it (what it wrote is reported), and those streams are deleted after the run."""
    out = tmp_path / "fanout.json"
    command = [sys.executable, "manage.py", "pgstreams_bench", "--fanout-shapes", "2x1x5", "--servers", "daphne"]
    command += ["--transports", "ws", "--duration", "1", "--ceiling-writer", "--json", str(out)]
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = json.loads(out.read_text())["runs"]
    ceiling = row["ceiling"]
    assert ceiling["writer_chunks"] == 2 * 5  # two streams at 5 chunks/s for 1 s, written beside the raw app
    assert (ceiling["coverage"], ceiling["duplicates"], ceiling["gaps"]) == (1.0, 0, 0)
    assert "raw p99 ms" in done.stdout
    assert not Stream.objects.filter(label="pgstreams-bench-fanout").exists()


def test_a_run_that_fails_stops_its_writer_at_once_and_deletes_its_streams() -> None:
    """The benchmark's writer process is killed as soon as a run fails before reading its report
    (not left to write on, or to wait to hand over a report nobody reads), and a writer that died
    as it booted is said to have ended, not awaited until the boot's timeout."""
    with pytest.raises(ValueError), fanout._writing(fanout.Shape(2, 1, 5), 5.0) as writer:
        writer.start()
        raise ValueError("the run failed")
    assert writer.process.exitcode == -signal.SIGKILL  # killed mid-write: 5 s of writing not let run out
    booting = fanout._writing(fanout.Shape(1, 1, 5), 1.0)
    with pytest.raises(RuntimeError, match=r"ended \(-9\) as it started"), booting as w:
        w.process.kill()
        w.process.join()
        w.start()
    assert not Stream.objects.filter(label=fanout.STREAMS_LABEL).exists()


def _cpu_parts_add_up(figures: dict) -> None:
    parts = [figures[f"{part}_cpu_us_per_delivery"] for part in ("writer", "postgres", "server")]
    assert min(parts) > 0 and figures["total_cpu_us_per_delivery"] == pytest.approx(sum(parts), abs=0.02)


@pytest.mark.slow
def test_a_tiny_durable_run_loads_the_reference_and_pgstreams_alike(tmp_path) -> None:
    """Every part of the Durable Streams load runs against both servers: appends, creates and
    catch-up reads none failed, every live reader got every append."""
    out = tmp_path / "durable.json"
    command = [sys.executable, "manage.py", "pgstreams_bench", "--durable", "--duration", "1", "--connections", "3"]
    command += ["--paced-streams", "2", "--paced-rate", "5", "--processes", "1", "--servers", "daphne"]
    command += ["--read-megabytes", "2"]  # two responses of pgstreams' (1 MiB at most each)
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    done = subprocess.run(
        command + ["--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert list(runs) == ["reference, file-backed", "pgstreams, 1 daphne process"]
    for name, run in runs.items():
        assert run["failed"] == {}, name
        [appends] = run["appends"]
        assert appends["connections"] == 3 and appends["appends"] > 0 and appends["failed"] == 0, name
        assert run["creates"]["creates"] > 0 and run["creates"]["failed"] == 0, name
        assert run["catch_up"]["whole_reads"] > 0 and run["catch_up"]["failed"] == 0, name
        [paced] = run["paced"]
        assert (paced["rate"], paced["failed"], paced["missed"]) == (5, 0, 0), name
        for live in ("long_poll", "sse"):
            assert run[live]["deliveries"] > 0 and run[live]["missed"] == 0, (name, live)
    assert "catch-up reads, MB/s" in done.stdout
    assert "token per POST, 2 streams: the most appends/s held" in done.stdout


@pytest.mark.slow
def test_a_tiny_catch_up_run_reads_every_chunk_over_both_transports(tmp_path) -> None:
    out = tmp_path / "catch-up.json"
    command = [sys.executable, "manage.py", "pgstreams_bench", "--catch-up", "65536", "--read-megabytes", "2"]
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    done = subprocess.run(
        command + ["--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())["catch_up"]["runs"]
    assert [(r["server"], r["transport"], r["chunks"]) for r in runs] == [("daphne", "ws", 30), ("daphne", "sse", 30)]
    assert all(0 < r["fetched_per_sent"] <= 2 and r["megabytes_per_second"] > 0 for r in runs)
    assert "fetched/sent" in done.stdout


@pytest.mark.slow
def test_a_tiny_takeover_run_loses_and_repeats_nothing(tmp_path) -> None:
    out = tmp_path / "takeover.json"
    command = [sys.executable, "manage.py", "pgstreams_bench", "--takeover", "--generations", "3", "--kills", "2"]
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    done = subprocess.run(
        command + ["--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())["takeover"]
    assert report["kills"] == report["taken_over"] == 2
    assert (report["duplicated"], report["lost"]) == (0, 0) and report["chunks_per_s"] > 0
    assert "takeover p50/p99/max ms" in done.stdout


@pytest.mark.slow
def test_a_tiny_storage_run_counts_the_bytes_of_every_chunk_and_prunes_them_all(tmp_path) -> None:
    out = tmp_path / "storage.json"
    command = [
        sys.executable,
        "manage.py",
        "pgstreams_bench",
        "--storage",
        "--storage-chunks",
        "400",
        "--streams",
        "20",
    ]
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    done = subprocess.run(
        command + ["--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tokens, lines = json.loads(out.read_text())["storage"]
    assert (tokens["shape"], tokens["chunks"], lines["shape"], lines["chunks"]) == ("tokens", 400, "lines", 400)
    for row in tokens, lines:
        plain, compacted = row["plain"], row["compacted"]
        data = 4 if row["shape"] == "tokens" else 100
        assert plain["bytes_per_chunk"]["data"] == compacted["bytes_per_chunk"]["data"] == data
        assert plain["bytes_per_chunk"]["heap"] > plain["bytes_per_chunk"]["data"] and plain["wal_bytes_per_chunk"] > 0
        assert compacted["bytes_per_chunk"]["total"] < plain["bytes_per_chunk"]["total"]
        assert compacted["compaction"]["runs"] > 0 and plain["prune"]["dead_tuples"] >= 400
        assert (plain["prune"]["streams"], plain["prune"]["chunks"]) == (20, 400)
        assert (compacted["prune"]["streams"], compacted["prune"]["chunks"]) == (20, 400)
    assert "dead tuples" in done.stdout


@pytest.mark.slow
def test_a_tiny_fleet_run_shares_the_notifications_out_by_shard(tmp_path) -> None:
    """Twenty streams over two reader processes and 256 channels: in the share shape each process
    hears about the streams it follows (about half the entries), in the broadcast shape all."""
    out = tmp_path / "fleet.json"
    command = [sys.executable, "manage.py", "pgstreams_bench", "--fleet", "share,broadcast", "--shards", "256"]
    command += ["--fleet-processes", "2", "--fleet-streams", "20", "--fleet-rate", "200", "--duration", "2"]
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    done = subprocess.run(
        command + ["--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    share, broadcast = (report["rows"][0] for report in json.loads(out.read_text())["fleet"])
    for row in share, broadcast:
        assert (row["processes"], row["coverage"], row["duplicates"]) == (2, 1.0, 0)
        assert row["postgres_us_per_delivery"] > 0 and row["readers_us_per_delivery"] > 0
    assert share["entries_per_process_s"] < 0.75 * broadcast["entries_per_process_s"]
    assert "NOTIFY_SHARDS 256" in done.stdout


def test_the_durable_catch_up_stream_must_have_a_size() -> None:
    with pytest.raises(CommandError, match="--read-megabytes above 0"):
        call_command("pgstreams_bench", "--durable", "--read-megabytes", "0")


def test_replica_writers_must_be_positive_numbers() -> None:
    with pytest.raises(CommandError, match="--replica-writers must be positive whole numbers"):
        call_command("pgstreams_bench", "--replica", "--replica-writers", "16,x")


@pytest.mark.slow
def test_a_tiny_llm_run_of_every_write_method(tmp_path, capsys) -> None:
    out, png = tmp_path / "llm.json", tmp_path / "llm.png"
    call_command(
        "pgstreams_bench",
        "--llm",
        "--streams",
        "20",
        "--tokens-per-second",
        "5",
        "--duration",
        "1.5",
        "--json",
        str(out),
        "--plot",
        str(png),
    )
    report = json.loads(out.read_text())
    assert report["find_max"] is None
    assert [r["method"] for r in report["llm"]] == ["aappend", "stream_writer", "awrite"]
    for run in report["llm"]:
        assert run["offered_per_s"] == 100 and run["sustained_per_s"] > 0
        assert run["committed"] > 0 and run["backlog"] == 0 and run["coverage"] == 1.0
        assert run["duplicates"] == 0 and run["out_of_order"] == 0
        assert run["write_errors"] == 0 and run["reader_errors"] == [] and run["unfinished_streams"] == 0
        assert set(run["e2e_ms"]) == {"p50", "p95", "p99", "p999", "max"} and run["e2e_ms"]["p50"] > 0
        assert run["xact_per_s"] > 0 and run["reader_peak_mib"] > 0
        uses_appender = run["method"] != "awrite"
        assert (run["appender_batches"] is not None and run["appender_batches"] > 0) == uses_appender
        assert 0 <= run["writer_gc_us_per_token"] <= run["writer_cpu_us_per_token"]
        _cpu_parts_add_up(run)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "sustained/s" in capsys.readouterr().out


def test_the_writers_gc_clock_counts_collections_inside_its_block_only() -> None:
    with llm_procs.GcClock() as collecting:
        gc.collect()
    inside = collecting.seconds
    gc.collect()
    assert inside > 0 and collecting.seconds == inside
    assert collecting._observe not in gc.callbacks


def test_llm_methods_must_be_known() -> None:
    with pytest.raises(CommandError, match="--methods must be some of"):
        call_command("pgstreams_bench", "--llm", "--methods", "aappend,nope")
