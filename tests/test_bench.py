"""pgstreams_bench in a tiny configuration, so that it keeps working: every mode, the pgbench
ceiling, the WebSocket mode, the JSON and the plot."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]


def test_a_tiny_run_of_every_mode(tmp_path, capsys) -> None:
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    call_command(
        "pgstreams_bench",
        "--mode",
        "all",
        "--writers",
        "4",
        "--duration",
        "1.5",
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
    assert set(report) >= {"machine", "config", "pgbench_tps", "runs", "ws"}
    assert [r["mode"] for r in report["runs"]] == ["insert_only", "buffered", "per_write", "off"]
    for run in report["runs"]:
        assert run["written"] > 0 and run["writes_per_s"] > 0
        assert run["duplicates"] == 0 and run["out_of_order"] == 0
        assert set(run["write_ms"]) == {"p50", "p95", "p99", "max"}
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
