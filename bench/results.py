"""The results page: ``docs/results.md`` and the README's short table, made from the latest report
of each kind of run in ``docs/results/`` (``pgstreams_bench ... --json docs/results/<kind>.json``,
``pgstreams_soak ... --json docs/results/soak.json``; ``pgstreams_bench --results`` writes
both). Every report says how it was made (``facts``): the command, the date, the commit and the
machine. Reads JSON and writes Markdown; runs nothing.
"""

from __future__ import annotations

import datetime
import platform
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
FRONT = re.compile(r"(<!-- results:[^\n]*-->\n).*?(<!-- /results -->)", re.S)


class Kind(NamedTuple):
    name: str  # the report's file: docs/results/<name>.json
    title: str
    what: str


KINDS = [
    Kind(
        "modes",
        "Writes and delivery per notification mode",
        (
            "Writers in one process, a transaction per write, with readers in other processes, in each "
            "notification mode, next to pgbench's ceiling for the same statement; with WebSocket "
            "clients of a daphne process."
        ),
    ),
    Kind(
        "llm",
        "LLM token streams",
        (
            "1,000 streams written at a fixed rate of tokens each, as an LLM server would, per write "
            "method; a reader process follows every stream."
        ),
    ),
    Kind(
        "fanout",
        "One server process to many sockets",
        (
            "Delivery from one server process to many WebSocket and SSE subscribers (Node clients "
            "acknowledging frames as pgstreams.js does, the writer in another process), beside a raw "
            "ASGI app that sends the same bytes with no database; with `--ceiling-writer`, while the "
            "same writer writes beside it, as it does beside pgstreams."
        ),
    ),
    Kind(
        "durable",
        "The Durable Streams endpoint",
        (
            "pgstreams' Durable Streams endpoint next to the protocol's reference server: appends, "
            "creates, reads and their latency."
        ),
    ),
    Kind(
        "catch_up",
        "A reader catching up",
        ("One reader catching up on a long stream over WebSocket and SSE, per chunk size: what it costs the server."),
    ),
    Kind(
        "takeover",
        "Generations on workers killed at random",
        (
            "Answers written by tasks on db_worker processes, workers killed mid-answer: every answer "
            "whole, once, and how long a takeover took."
        ),
    ),
    Kind(
        "fleet",
        "A fleet of reader processes on one Postgres",
        (
            "P reader processes sharing the streams (each stream followed in one process): delivery, "
            "latency, and the CPU per delivered chunk of Postgres and of the readers."
        ),
    ),
    Kind(
        "soak",
        "The soak",
        (
            "Every kind of writer and reader at once (generations on db_worker processes, AI SDK answers "
            "read by the SDK's own client, PgBouncer, idempotent producers), several processes, under "
            "faults drawn from each seed; every stream checked against the table "
            '(docs/explanation/reliability.md, "The soak").'
        ),
    ),
    Kind(
        "storage",
        "What a chunk costs on disk",
        (
            "A million chunks written as LLM tokens (4 bytes, 20 a second a stream) and as log lines "
            "(100 bytes), a stream_writer per stream, on a scratch server: the chunk table's bytes per "
            "chunk (heap, TOAST, indexes) and the WAL per chunk, beside the data's own bytes, as written "
            "and once compacted (pgstreams_compact, then the table rewritten); then every stream pruned: "
            "its time, WAL and the dead tuples it leaves. Then the chunks partitioned by day (pgstreams_partition): "
            "a table of a million chunks converted, and a day made beside them; then 1,000 streams of a past "
            "day written and the day pruned, by dropping its partition, at an eighth of the chunks and at all of them."
        ),
    ),
    Kind(
        "frozen",
        "A reader process frozen",
        (
            "One of three reader processes stopped (SIGSTOP) for a minute while its notifications would"
            " fill a small notification queue: the other readers' latency before, during and after, and"
            " the writes that failed."
        ),
    ),
]


def facts(argv: list[str], program: str = "pgstreams_bench") -> dict[str, Any]:
    """How a report is made, taken before its run: the command (``argv``: its options as given to
    manage.py ``program``; none when called from Python), when, at which commit, on what
    machine. The report's ``kind`` is added when it is known."""
    from .run import host

    facts = host()
    return {
        "command": f"python manage.py {program} {shlex.join(argv)}" if argv else "call_command()",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "machine": f"{facts['cpus']} CPUs, {facts['memory_gib']:.0f} GiB, Python {facts['python']}, "
        f"{platform.system()} {platform.release()}",
    }


def _commit() -> str:
    """The checkout's commit, ``-dirty`` when files other than the results differ from it."""
    git = ["git", "-C", str(ROOT)]
    try:
        commit = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout
        changed = subprocess.run(
            [
                *git,
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":!docs/results",
                ":!docs/results.md",
                ":!README.md",
            ],
            capture_output=True,
            text=True,
        ).stdout
    except OSError:  # no git here
        return "unknown"
    return (commit.strip() + ("-dirty" if changed.strip() else "")) or "unknown"


def table(report: dict[str, Any]) -> str:
    """The report's table, as the benchmark prints it."""
    from .catchup import table as catch_up
    from .durable import table as durable
    from .fanout import table as fanout
    from .fleet import fleet_table, frozen_table
    from .report import table as modes
    from .soak.run import table as soak
    from .storage import table as storage
    from .takeover import table as takeover

    kind = report["run"]["kind"]
    if kind == "fleet":
        return "\n\n".join(fleet_table(run) for run in report["fleet"])
    if kind == "frozen":
        return "\n\n".join(frozen_table(run) for run in report["frozen"])
    tables: dict[str, Callable[[dict[str, Any]], str]] = {
        "modes": modes,
        "llm": modes,
        "fanout": fanout,
        "durable": durable,
        "catch_up": catch_up,
        "takeover": takeover,
        "soak": soak,
        "storage": storage,
    }
    return tables[kind](report)


def postgres(report: Any) -> str | None:
    """The PostgreSQL version the report names, wherever it does."""
    if isinstance(report, dict):
        found = report.get("postgres")
        if isinstance(found, str):
            return found
        values = list(report.values())
    elif isinstance(report, list):
        values = report
    else:
        return None
    return next((version for value in values if (version := postgres(value))), None)


def reports(folder: Path = FOLDER) -> dict[str, dict[str, Any]]:
    import json

    return {
        kind.name: json.loads(path.read_text()) for kind in KINDS if (path := folder / f"{kind.name}.json").exists()
    }


def page(folder: Path = FOLDER) -> str:
    """docs/results.md: for each kind with a report, its table and how it was made."""
    lines = [
        "# Results",
        "",
        "The latest run of each kind of benchmark, on the machine it names. Made by",
        "`python manage.py pgstreams_bench --results` from the reports in `docs/results/`; each",
        "report is what the command under its title wrote with `--json`. Quote ratios from one",
        "run: absolute figures drift on shared machines. How these came to be, and what was tried",
        "on the way, is in `docs/notes/BENCHMARKS.md`.",
    ]
    found = reports(folder)
    for kind in KINDS:
        report = found.get(kind.name)
        if report is None:
            continue
        run = report["run"]
        version = postgres(report)
        machine = run["machine"] + (f", PostgreSQL {version}" if version else "")
        lines += ["", f"## {kind.title}", "", kind.what, "", "```text", f"$ {run['command']}", table(report), "```"]
        lines += ["", f"{run['date']}, commit `{run['commit']}`, {machine}."]
    return "\n".join(lines) + "\n"


def front(folder: Path = FOLDER) -> str:
    """The README's short table: a few figures from the reports, as on the results page."""
    found = reports(folder)
    rows = []
    if "modes" in found:
        plain, notified = found["modes"].get("pgbench_tps"), found["modes"].get("pgbench_notify_tps")
        if plain and notified:
            rows.append(
                (
                    "pgbench, the write statement from C clients, transactions/s",
                    f"{plain:,.0f} plain, {notified:,.0f} with a `pg_notify` in each ({plain / notified:.1f}x)",
                )
            )
        runs = {run["mode"]: run for run in found["modes"]["runs"]}
        buffered, per_write = runs.get("buffered"), runs.get("per_write")
        if buffered and per_write:
            ratio = buffered["writes_per_s"] / per_write["writes_per_s"]
            rows.append(
                (
                    f"Writes/s, {found['modes']['config']['writers']} connections, a transaction each",
                    f"{buffered['writes_per_s']:,.0f} batched, {per_write['writes_per_s']:,.0f} with a NOTIFY per "
                    f"write ({ratio:.1f}x)",
                )
            )
            e2e = buffered["e2e_ms"]
            rows.append(("Commit to a reader in another process, p50 / p99", f"{e2e['p50']:.1f} / {e2e['p99']:.1f} ms"))
    if "llm" in found:
        by_method = {row["method"]: row for row in found["llm"]["llm"]}
        row = by_method.get("stream_writer") or found["llm"]["llm"][0]  # the token path the docs advise
        rows.append(
            (
                f"{row['streams']:,} token streams at {row['tokens_per_stream_s']:g} tokens/s each ({row['method']})",
                f"{row['sustained_per_s']:,.0f} of {row['offered_per_s']:,.0f} tokens/s sustained, p50 "
                f"{row['e2e_ms']['p50']:.0f} ms",
            )
        )
    if "frozen" in found:
        for run in found["frozen"]["frozen"]:
            phases = [reader["phases"] for reader in run["healthy"]]
            p99 = "/".join(f"{max(p[phase]['p99'] for p in phases):.1f}" for phase in ("before", "during", "after"))
            rows.append(
                (
                    f"A reader process stopped {run['config']['stopped']:g} s, a {run['config']['queue_pages']}-page "
                    f"notification queue ({run['config']['mode']})",
                    f"{run['write_errors']} writes failed; others' p99 {p99} ms before/during/after",
                )
            )
    machines = sorted({report["run"]["machine"] for report in found.values()})
    head = f"On {' and on '.join(machines)}, from the [results page](docs/results.md), which says how each was run:"
    table = ["| What | Measured |", "| --- | --- |", *(f"| {what} | {figure} |" for what, figure in rows)]
    return "\n".join([head, "", *table]) + "\n"


def write() -> list[Path]:
    """Write docs/results.md and the README's table; return the files written."""
    PAGE.write_text(page())
    made, blocks = FRONT.subn(lambda m: m[1] + front() + m[2], README.read_text())
    if blocks != 1:
        raise ValueError(f"README.md should hold one <!-- results --> block, not {blocks}")
    README.write_text(made)
    return [PAGE, README]
