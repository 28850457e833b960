"""The benchmark's output: a table for the terminal and a PNG (latency CDFs and writes/s bars;
for ``--llm``, latency CDFs and sustained against offered tokens/s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _coverage(row: dict[str, Any]) -> str:
    return "-" if row["coverage"] is None else f"{row['coverage']:.4f}"


# A column: its title, its width (the first column is left-aligned) and its cell for a row.
Column = tuple[str, int, Callable[[dict[str, Any]], str]]

RUN_COLUMNS: list[Column] = [
    ("mode", 12, lambda r: r["mode"]),
    ("writes/s", 10, lambda r: f"{r['writes_per_s']:.0f}"),
    ("write p50", 10, lambda r: _ms(r["write_ms"]["p50"])),
    ("p99", 8, lambda r: _ms(r["write_ms"]["p99"])),
    ("e2e p50", 9, lambda r: _ms(r["e2e_ms"]["p50"])),
    ("p99", 8, lambda r: _ms(r["e2e_ms"]["p99"])),
    ("p99.9", 8, lambda r: _ms(r["e2e_ms"]["p999"])),
    ("max", 8, lambda r: _ms(r["e2e_ms"]["max"])),
    ("coverage", 10, _coverage),
    ("dup", 5, lambda r: str(r["duplicates"])),
    ("ooo", 5, lambda r: str(r["out_of_order"])),
    ("backends", 9, lambda r: str(r["reader_backends"])),
    ("polls/s", 8, lambda r: f"{r['poll_queries_per_s']:.2f}"),
]

REPLICA_COLUMNS: list[Column] = [
    ("level", 14, lambda r: r["level"]),
    ("writers", 8, lambda r: str(r["writers"])),
    ("writes/s", 10, lambda r: f"{r['writes_per_s']:.0f}"),
    ("write p50", 10, lambda r: _ms(r["write_ms"]["p50"])),
    ("p95", 7, lambda r: _ms(r["write_ms"]["p95"])),
    ("p99", 7, lambda r: _ms(r["write_ms"]["p99"])),
    ("p99.9", 7, lambda r: _ms(r["write_ms"]["p999"])),
    ("e2e p50", 9, lambda r: _ms(r["e2e_ms"]["p50"])),
    ("p99", 7, lambda r: _ms(r["e2e_ms"]["p99"])),
    ("p99.9", 7, lambda r: _ms(r["e2e_ms"]["p999"])),
    ("behind", 8, lambda r: f"{r['fetches_behind']:.1%}"),
    ("coverage", 10, _coverage),
    ("dup", 5, lambda r: str(r["duplicates"])),
]


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


LLM_COLUMNS: list[Column] = [
    ("method", 14, lambda r: r["method"]),
    ("tok/s/str", 10, lambda r: f"{r['tokens_per_stream_s']:g}"),
    ("offered/s", 10, lambda r: f"{r['offered_per_s']:.0f}"),
    ("sustained/s", 12, lambda r: f"{r['sustained_per_s']:.0f}"),
    ("backlog", 8, lambda r: _opt(r["backlog"], "d")),
    ("e2e p50", 9, lambda r: _ms(r["e2e_ms"]["p50"])),
    ("p95", 9, lambda r: _ms(r["e2e_ms"]["p95"])),
    ("p99", 9, lambda r: _ms(r["e2e_ms"]["p99"])),
    ("max", 9, lambda r: _ms(r["e2e_ms"]["max"])),
    ("coverage", 9, _coverage),
    ("dup", 4, lambda r: str(r["duplicates"])),
    ("ooo", 4, lambda r: str(r["out_of_order"])),
    ("xact/s", 8, lambda r: f"{r['xact_per_s']:.0f}"),
    ("rss MiB", 8, lambda r: f"{r['reader_peak_mib']:.0f}"),
    ("us/entry", 9, lambda r: _opt(r["decode_us_per_entry"], ".2f")),
    ("unfollowed", 11, lambda r: _opt(r.get("unfollowed_us_per_entry"), ".2f")),
    ("batches", 8, lambda r: _opt(r["appender_batches"], "d")),
    ("batch", 6, lambda r: _opt(r["mean_batch"], ".0f")),
    ("lag p99", 9, lambda r: _ms(r["schedule_lag_ms"]["p99"])),
    ("cpu/tok", 8, lambda r: _opt(r.get("writer_cpu_us_per_token"), ".1f")),
    ("appender", 9, lambda r: _opt(r.get("appender_cpu_us_per_token"), ".1f")),
    ("gc", 6, lambda r: _opt(r.get("writer_gc_us_per_token"), ".1f")),
]

LLM_NOTE = (
    "(ms; e2e = write call start to receipt by a reader; tok/s/str = tokens/s per stream; sustained = committed "
    "in the writing window / its length; backlog = committed, not received by the slowest reader when the drain "
    "ended; coverage = its share received; xact/s = the server's transactions/s in the window; rss = a reader "
    "process's peak (the daphne server's with --ws); us/entry = the listener's CPU per notification entry of a "
    "followed stream, unfollowed = of a stream nobody in the process follows; "
    "batches and batch = the appender's commits and their mean size; lag = writer calls' start after their deadline; "
    "cpu/tok = the writer processes' CPU per token in us, pacing included; appender = its appender thread's share; "
    "gc = the garbage collector's share, on any thread; pace = the same schedule, nothing written)"
)


LLM_CPU_COLUMNS: list[Column] = [
    ("method", 14, lambda r: r["method"]),
    ("tok/s/str", 10, lambda r: f"{r['tokens_per_stream_s']:g}"),
    ("writer", 9, lambda r: _opt(r["writer_cpu_us_per_delivery"], ".1f")),
    ("postgres", 9, lambda r: _opt(r["postgres_cpu_us_per_delivery"], ".1f")),
    ("server", 9, lambda r: _opt(r["server_cpu_us_per_delivery"], ".1f")),
    ("sum", 9, lambda r: _opt(r["total_cpu_us_per_delivery"], ".1f")),
]

LLM_CPU_NOTE = (
    "(CPU per token delivered to a reader, us, from the writers' release until every process reported: writer = "
    "the writer processes, appender included; postgres = every process of the server; server = the reader "
    "processes, or the daphne server with --ws)"
)


def _grid(columns: list[Column], rows: list[dict[str, Any]]) -> list[str]:
    """A header, a rule and a fixed-width line per row."""

    def line(cells: list[str]) -> str:
        widths = [width for _, width, _ in columns]
        return f"{cells[0]:<{widths[0]}}" + "".join(f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True))

    head = line([title for title, _, _ in columns])
    return [head, "-" * len(head)] + [line([cell(row) for _, _, cell in columns]) for row in rows]


def table(report: dict[str, Any]) -> str:
    """The runs as a fixed-width table, with the pgbench ceiling and ratios below it."""
    if report.get("replica"):
        return replica_table(report["replica"])
    if "llm" in report:
        return llm_table(report)
    lines = _grid(RUN_COLUMNS, report["runs"])
    lines.append("(latencies in ms; backends and polls/s summed over the reader processes)")
    if report.get("pgbench_tps") is not None:
        lines.append(
            f"pgbench, the write statement from C clients: {report['pgbench_tps']:.0f} tps plain, "
            f"{report['pgbench_notify_tps']:.0f} tps with pg_notify in each transaction"
        )
    by_mode = {run["mode"]: run["writes_per_s"] for run in report["runs"]}
    if "buffered" in by_mode:
        for other in ("insert_only", "per_write"):
            if by_mode.get(other):
                lines.append(f"buffered / {other}: {by_mode['buffered'] / by_mode[other]:.2f}x")
    ws = report.get("ws")
    if ws:
        e = ws["e2e_ms"]
        lines.append(
            f"WebSocket: {ws['clients']} clients, {ws['delivered_per_s']:.0f} chunks/s delivered, "
            f"e2e p50 {_ms(e['p50'])} p99 {_ms(e['p99'])} max {_ms(e['max'])} ms, coverage {ws['coverage']:.4f}, "
            f"server peak memory {ws['server_peak_mib']:.0f} MiB"
        )
    return "\n".join(lines)


def _less_pacing(rows: list[dict[str, Any]]) -> list[str]:
    """Each method's CPU per token less the pacing's, when the run measured ``pace`` too."""
    paced = [r["writer_cpu_us_per_token"] for r in rows if r["method"] == "pace"]
    if not paced or paced[0] is None:
        return []
    return [
        f"{r['method']}: {r['writer_cpu_us_per_token'] - paced[0]:.1f} us of CPU per token less the pacing's"
        for r in rows
        if r["method"] != "pace" and r["writer_cpu_us_per_token"] is not None
    ]


def _llm_cpu(rows: list[dict[str, Any]]) -> list[str]:
    """Where a delivered token's CPU goes, for the rows that measured it (none in reports made before)."""
    measured = [r for r in rows if "total_cpu_us_per_delivery" in r]
    return ["", *_grid(LLM_CPU_COLUMNS, measured), LLM_CPU_NOTE] if measured else []


def llm_table(report: dict[str, Any]) -> str:
    """One line per method (or, for --find-max, per step), then the rate that held; then where a
    delivered token's CPU goes."""
    if not report.get("find_max"):
        rows = report["llm"]
        return "\n".join(_grid(LLM_COLUMNS, rows) + [LLM_NOTE] + _less_pacing(rows) + _llm_cpu(rows))
    rows = [step for sweep in report["find_max"] for step in sweep["steps"]]
    lines = _grid(LLM_COLUMNS, rows) + [LLM_NOTE]
    for sweep in report["find_max"]:
        held = sweep["held_tokens_per_stream_s"]
        lines.append(
            f"{sweep['method']}: held up to {held:g} tokens/s per stream ({sweep['held_offered_per_s']:.0f} tokens/s)"
            if held is not None
            else f"{sweep['method']}: did not hold at the first rate"
        )
    return "\n".join(lines + _llm_cpu(rows))


def replica_table(rows: list[dict[str, Any]]) -> str:
    """The replica sweep: a line per (level, writers), then the throughput ratios between levels."""
    lines = _grid(REPLICA_COLUMNS, rows)
    lines.append(
        "(latencies in ms; write = the write() call, e2e = its return to receipt by a reader on the standby; "
        "behind = readers' fetches that found the standby behind what was announced)"
    )
    rate = {(row["level"], row["writers"]): row["writes_per_s"] for row in rows}
    for writers in sorted({row["writers"] for row in rows}):
        ratios = [
            f"{a}/{b} {rate[a, writers] / rate[b, writers]:.2f}x"
            for a, b in (("remote_write", "on"), ("on", "remote_apply"), ("off", "on"))
            if rate.get((a, writers)) and rate.get((b, writers))
        ]
        lines.append(f"writes/s at {writers} writers: " + ", ".join(ratios))
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str) -> None:
    """End-to-end latency CDF per mode, and writes/s per mode against the pgbench ceiling (or,
    for a replica sweep, ``plot_replica``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if report.get("replica"):
        return plot_replica(report, path)
    if "llm" in report:
        return plot_llm(report, path)

    runs = report["runs"]
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        points = run.get("e2e_cdf_ms")
        if points:
            cdf.plot(points, [i / 100 for i in range(len(points))], label=run["mode"])
    cdf.set_xscale("log")
    cdf.set_xlabel("commit to receipt (ms, log scale)")
    cdf.set_ylabel("fraction of deliveries")
    cdf.set_title("End-to-end latency")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend()

    names = [run["mode"] for run in runs]
    drawn = bars.bar(names, [run["writes_per_s"] for run in runs], color="#4c72b0")
    bars.bar_label(drawn, fmt="%.0f")
    for ceiling, label, style in (
        (report.get("pgbench_tps"), "pgbench, plain", "-"),
        (report.get("pgbench_notify_tps"), "pgbench, pg_notify per write", "--"),
    ):
        if ceiling:
            bars.axhline(ceiling, color="#c44e52", linestyle=style, label=f"{label}: {ceiling:.0f}/s")
    bars.set_ylabel("writes/s")
    bars.set_title(f"Writes/s, {runs[0]['writers'] if runs else 0} writers")
    bars.legend()
    fig.suptitle(f"pgstreams_bench on {report['machine']['cpus']} CPUs, PostgreSQL {report['machine']['postgres']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_replica(report: dict[str, Any], path: str) -> None:
    """Per synchronous_commit level: writes/s and standby readers' latency against writers, and
    write latency percentiles at the most writers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["replica"]
    levels = list(dict.fromkeys(row["level"] for row in rows))
    fig, (rate, e2e, tail) = plt.subplots(1, 3, figsize=(16, 4.8))
    for level in levels:
        mine = [row for row in rows if row["level"] == level]
        writers = [r["writers"] for r in mine]
        rate.plot(writers, [r["writes_per_s"] for r in mine], marker="o", label=level)
        e2e.plot(writers, [r["e2e_ms"]["p50"] for r in mine], marker="o", label=level)
    rate.set_ylabel("writes/s")
    rate.set_title("Throughput")
    e2e.set_yscale("log")
    e2e.set_ylabel("ms, log scale")
    e2e.set_title("Readers on the standby: e2e p50")
    for ax in (rate, e2e):
        ax.set_xlabel("writers")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")

    most = max(row["writers"] for row in rows)
    at_most = {row["level"]: row["write_ms"] for row in rows if row["writers"] == most}
    keys = ("p50", "p95", "p99", "p999")
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(levels))]
        tail.bar(xs, [at_most[level][key] or 0 for level in levels], width, label=key)
    tail.set_xticks(range(len(levels)), levels, fontsize="small")
    tail.set_yscale("log")
    tail.set_ylim(top=tail.get_ylim()[1] * 4)  # room for the legend above the bars
    tail.set_ylabel("write() latency (ms, log scale)")
    tail.set_title(f"Write latency at {most} writers")
    tail.legend(ncol=4, fontsize="small", loc="upper center")
    fig.suptitle(
        f"synchronous_commit levels, one synchronous standby on the same host; "
        f"{report['machine']['cpus']} CPUs, PostgreSQL {report['machine']['postgres']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_llm(report: dict[str, Any], path: str) -> None:
    """``--llm``: end-to-end latency CDF per run, and sustained against offered tokens/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = report.get("find_max")
    rows = [step for sweep in sweeps for step in sweep["steps"]] if sweeps else report["llm"]
    names = [f"{r['method']} {r['tokens_per_stream_s']:g}/s" if sweeps else r["method"] for r in rows]
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(13, 4.8))
    for row, name in zip(rows, names, strict=True):
        if row["e2e_cdf_ms"]:
            cdf.plot(row["e2e_cdf_ms"], [i / 100 for i in range(len(row["e2e_cdf_ms"]))], label=name)
    cdf.set_xscale("log")
    cdf.set_xlabel("write call start to receipt (ms, log scale)")
    cdf.set_ylabel("fraction of deliveries")
    cdf.set_title("End-to-end latency")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend(fontsize="small")

    drawn = bars.bar(names, [r["sustained_per_s"] for r in rows], color="#4c72b0", label="sustained")
    bars.bar_label(drawn, fmt="%.0f")
    bars.scatter(names, [r["offered_per_s"] for r in rows], color="#c44e52", marker="_", s=600, label="offered")
    bars.set_ylabel("tokens/s")
    bars.set_title("Sustained against offered")
    bars.tick_params(axis="x", labelrotation=30, labelsize="small")
    bars.legend()
    config = report["config"]
    fig.suptitle(
        f"pgstreams_bench --llm: {config['streams']} streams, {config['readers']} reader "
        f"process{'es' if config['readers'] != 1 else ''}"
        f"{' (WebSocket)' if config['ws'] else ''}; {report['machine']['cpus']} CPUs, "
        f"PostgreSQL {report['machine']['postgres']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
