"""``manage.py pgstreams_bench``: a thin wrapper over the ``bench`` package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bench import results
from bench.catchup import CatchUpConfig, run_catch_up
from bench.durable import DurableConfig, run_durable
from bench.fanout import TRANSPORTS, FanoutConfig, Shape, run_fanout
from bench.fleet import SHAPES, FleetConfig, FrozenConfig, run_fleet, run_frozen
from bench.llm import LlmConfig, run_llm
from bench.llm_procs import APPEND_METHODS, METHODS, PACE
from bench.report import plot
from bench.run import MODES, Config, run
from bench.storage import SHAPES as STORAGE_SHAPES
from bench.storage import StorageConfig, run_storage
from bench.takeover import TakeoverConfig, connections_problem, run_takeover
from demo_project.servers import SERVERS


class Command(BaseCommand):
    help = (
        "Measure writes/s and delivery latency per notification mode, with the pgbench ceiling; "
        "or, with --replica, per synchronous_commit level against a streaming standby; "
        "or, with --llm, token streams written at a fixed rate per write method; "
        "or, with --durable, the Durable Streams endpoint next to the protocol's reference server; "
        "or, with --catch-up, one reader catching up over WebSocket and SSE, per chunk size; "
        "or, with --takeover, generations in flight on task workers killed at random; "
        "or, with --frozen, one of three reader processes stopped while its notifications fill the queue; "
        "or, with --fleet, reader processes in each shape and number; "
        "or, with --storage, what a chunk costs on disk and in WAL, and pruning them; "
        "or, with --results, the results page from the latest reports."
    )

    argv: list[str] = []  # the options as given to manage.py, for the report's "run"

    def run_from_argv(self, argv: list[str]) -> None:
        self.argv = argv[2:]
        super().run_from_argv(argv)

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--mode", default="all", choices=["all", *MODES])
        parser.add_argument("--writers", type=int, default=32, help="concurrent writing connections")
        parser.add_argument("--writer-processes", type=int, default=0, help="processes they run in (0: one per CPU)")
        parser.add_argument("--streams-per-writer", type=int, default=1)
        parser.add_argument(
            "--readers",
            type=int,
            default=None,
            help="reader processes (default 2; 1 with --llm, where 0 measures the write path alone)",
        )
        parser.add_argument("--fanout", type=int, default=1, help="readers of every stream in each reader process")
        parser.add_argument("--duration", type=float, default=10.0, help="seconds of writing per mode")
        parser.add_argument("--rate", type=float, default=None, help="writes/s in total (default: flat out)")
        parser.add_argument(
            "--ws",
            action="store_true",
            help="also run the WebSocket mode; with --llm, the readers are WebSocket clients of a daphne process",
        )
        parser.add_argument("--clients", type=int, default=50, help="WebSocket clients in --ws mode")
        parser.add_argument("--no-pgbench", action="store_true", help="skip the pgbench ceiling")
        parser.add_argument(
            "--replica",
            action="store_true",
            help="instead of the modes: each synchronous_commit level against a synchronous standby "
            "built from the embedded PostgreSQL, readers on the standby",
        )
        parser.add_argument(
            "--replica-writers",
            default="16,32,64",
            help="writer counts for --replica, comma-separated (default 16,32,64)",
        )
        parser.add_argument(
            "--llm",
            action="store_true",
            help="instead of the modes: --streams streams written at --tokens-per-second each by one asyncio task "
            "per stream in --writer-processes processes, every stream followed by each of --readers processes; "
            "once per write method (--methods), each with fresh streams and processes",
        )
        parser.add_argument("--streams", type=int, default=1000, help="streams written at once, with --llm")
        parser.add_argument("--tokens-per-second", type=float, default=20.0, help="per stream, with --llm")
        parser.add_argument(
            "--methods",
            default=",".join(METHODS),
            help=f"write methods for --llm, comma-separated (default {','.join(METHODS)}); {PACE} keeps their "
            "schedule and writes nothing, without readers: the pacing's own CPU, which every method's includes",
        )
        parser.add_argument(
            "--find-max",
            action="store_true",
            help="with --llm, for each append method chosen (awrite is left out): raise --tokens-per-second x1.5 "
            "per step, --streams fixed, at most 8 steps of --duration each, until sustained tokens/s falls below "
            "95%% of offered, the e2e p99 passes 250 ms or a reader misses chunks; report the last rate that held",
        )
        parser.add_argument(
            "--durable",
            action="store_true",
            help="instead of the modes: the same load from node (--connections appenders, creates, catch-up "
            "readers, --paced-streams token-per-POST streams read over SSE, long-poll and SSE readers) on the "
            "Durable Streams reference server (file-backed) and on pgstreams' "
            "endpoint in each number of daphne processes of --processes; --duration seconds per part",
        )
        parser.add_argument(
            "--connections",
            default="64,100,1000",
            help="with --durable: concurrent appenders, one stream and one append in flight each, one part per "
            "number (comma-separated)",
        )
        parser.add_argument(
            "--paced-streams",
            type=int,
            default=1000,
            help="with --durable: streams of the token-per-POST part (0 for none)",
        )
        parser.add_argument(
            "--paced-rate",
            default="0.25,0.5,1,2,5,10,20",
            help="with --durable: appends/s to each of them, one part per rate (comma-separated), climbing until "
            "one is not held (something failed or missed, or the answers' p99 over 1 s)",
        )
        parser.add_argument(
            "--read-megabytes",
            type=float,
            default=20.0,
            help="with --durable: size of the stream the catch-up readers read whole, again and again",
        )
        parser.add_argument(
            "--catch-up",
            default="",
            help="instead of the modes: chunk sizes in bytes (comma-separated, such as 1024,65536), each a stream "
            "of --read-megabytes read from its start by one WebSocket and one SSE reader of each of --servers; "
            "their MB/s and what the server fetched for them",
        )
        parser.add_argument(
            "--takeover",
            action="store_true",
            help="instead of the modes: --generations answers in flight on django-tasks-db workers (one each, and "
            "one spare per kill), --kills of them killed at random; takeover time, chunks duplicated and lost",
        )
        parser.add_argument(
            "--storage",
            action="store_true",
            help="instead of the modes: --storage-chunks chunks of each shape (4-byte tokens, 100-byte lines) "
            "written over --streams streams on a scratch server; bytes per chunk on disk and in WAL, and the prune",
        )
        parser.add_argument(
            "--storage-chunks", type=int, default=1_000_000, help="with --storage: chunks written per shape"
        )
        parser.add_argument(
            "--storage-shapes", default=",".join(STORAGE_SHAPES), help="with --storage: some of tokens,lines"
        )
        parser.add_argument("--generations", type=int, default=100, help="with --takeover: answers in flight")
        parser.add_argument("--kills", type=int, default=20, help="with --takeover: workers killed")
        parser.add_argument(
            "--frozen",
            action="store_true",
            help="instead of the modes: a writer and three reader processes on a scratch server whose notification "
            "queue fills in seconds, one reader stopped for --stopped seconds, in buffered and per_write mode (or "
            "--mode); the others' latency before, during and after, failed writes, the stopped one's catch-up",
        )
        parser.add_argument("--stopped", type=float, default=60.0, help="with --frozen: seconds the reader is stopped")
        parser.add_argument(
            "--no-guard", action="store_true", help="with --frozen: NOTIFY_QUEUE_GUARD None (no listener is ended)"
        )
        parser.add_argument("--tcp", action="store_true", help="with --frozen: connect over TCP on 127.0.0.1")
        parser.add_argument(
            "--fleet",
            default="",
            help=f"instead of the modes: shapes among {', '.join(SHAPES)} (comma-separated), each run with every "
            "count of --fleet-processes reader processes for --duration s, each with every --shards; deliveries, "
            "latency, notifications per process, Postgres' and the readers' CPU per delivered chunk",
        )
        parser.add_argument("--fleet-processes", default="1,2,4,8,16", help="with --fleet: reader process counts")
        parser.add_argument("--shards", default="1", help="with --fleet: NOTIFY_SHARDS values, comma-separated")
        parser.add_argument("--fleet-streams", type=int, default=1000, help="with --fleet: streams written")
        parser.add_argument("--fleet-rate", type=float, default=2000.0, help="with --fleet: chunks/s in total")
        parser.add_argument(
            "--processes", default="1,2", help="daphne process counts for --durable, comma-separated (default 1,2)"
        )
        parser.add_argument(
            "--fanout-shapes",
            default="",
            help="instead of the modes: shapes SxNxR (S streams x N subscribers x R chunks/s per stream), "
            "comma-separated, each delivered by one server process to Node subscribers for --duration seconds, "
            "with the raw ASGI ceiling on the same server",
        )
        parser.add_argument("--transports", default="ws", help=f"for --fanout-shapes: some of {', '.join(TRANSPORTS)}")
        parser.add_argument(
            "--servers",
            default="daphne",
            help=f"for --fanout-shapes and --durable: some of {', '.join(SERVERS)} (with --durable, daphne in "
            "--processes processes, the others in one)",
        )
        parser.add_argument("--no-ceiling", action="store_true", help="for --fanout-shapes: skip the raw ASGI runs")
        parser.add_argument(
            "--ceiling-writer",
            action="store_true",
            help="for --fanout-shapes: run the shape's writer beside the raw app too (to streams nobody reads): "
            "what a server sending each chunk in a frame of its own could deliver while the writer and Postgres "
            "take their share of the machine",
        )
        parser.add_argument(
            "--idle", type=int, default=0, help="for --fanout-shapes: also that many idle connections of each kind"
        )
        parser.add_argument("--json", dest="json_path", help="write the report as JSON here")
        parser.add_argument("--plot", dest="plot_path", help="write the plot as PNG here")
        parser.add_argument(
            "--results",
            action="store_true",
            help="run nothing: make docs/results.md and the README's table from the reports in docs/results/",
        )

    def handle(self, *args: Any, **o: Any) -> None:
        if o["results"]:
            for path in results.write():
                self.stdout.write(f"wrote {path}")
            return
        if o["json_path"]:  # made now: a run can take minutes, and its report must not be lost at the end
            Path(o["json_path"]).parent.mkdir(parents=True, exist_ok=True)
        made = results.facts(self.argv)
        if o["readers"] is None:
            o["readers"] = 1 if o["llm"] else 2
        for name in ("writers", "readers", "fanout", "streams_per_writer", "clients"):
            if o[name] < (0 if name == "readers" else 1):
                raise CommandError(f"--{name.replace('_', '-')} must be at least {0 if name == 'readers' else 1}")
        if o["duration"] <= 0 or (o["rate"] is not None and o["rate"] <= 0):
            raise CommandError("--duration and --rate must be positive")
        replica_writers = _counts(o, "replica_writers")
        if o["fleet"]:
            shapes = o["fleet"].split(",")
            if set(shapes) - set(SHAPES) or o["fleet_streams"] < 1 or o["fleet_rate"] <= 0:
                raise CommandError(f"--fleet takes shapes among {', '.join(SHAPES)}; --fleet-streams and -rate > 0")
            processes, shard_counts = _counts(o, "fleet_processes"), _counts(o, "shards")
            kind, report = "fleet", {"fleet": []}
            for shape in shapes:
                for shards in shard_counts:
                    config = FleetConfig(
                        processes=processes,
                        shape=shape,
                        shards=shards,
                        streams=o["fleet_streams"],
                        rate=o["fleet_rate"],
                        duration=o["duration"],
                    )
                    report["fleet"].append(run_fleet(config, say=self.say))
        elif o["frozen"]:
            modes = ("buffered", "per_write") if o["mode"] == "all" else (o["mode"],)
            if set(modes) - {"buffered", "per_write"} or o["stopped"] <= 0:
                raise CommandError("--frozen runs --mode buffered or per_write (or all: both), --stopped above 0")
            guard = None if o["no_guard"] else FrozenConfig.guard
            kind, report = (
                "frozen",
                {
                    "frozen": [
                        run_frozen(
                            FrozenConfig(mode=mode, stopped=o["stopped"], guard=guard, tcp=o["tcp"]), say=self.say
                        )
                        for mode in modes
                    ]
                },
            )
        elif o["takeover"]:
            if o["generations"] < 1 or o["kills"] < 0:
                raise CommandError("--generations must be at least 1 and --kills at least 0")
            config = TakeoverConfig(generations=o["generations"], kills=o["kills"])
            problem = connections_problem(config)
            if problem:
                raise CommandError(problem)
            kind, report = "takeover", run_takeover(config, say=self.say)
        elif o["storage"]:
            shapes = tuple(o["storage_shapes"].split(","))
            if set(shapes) - set(STORAGE_SHAPES) or o["storage_chunks"] < o["streams"] or o["streams"] < 1:
                raise CommandError(
                    f"--storage-shapes takes {', '.join(STORAGE_SHAPES)}; --storage-chunks at least --streams"
                )
            config = StorageConfig(chunks=o["storage_chunks"], streams=o["streams"], shapes=shapes)
            kind, report = "storage", run_storage(config, say=self.say)
        elif o["catch_up"]:
            kind, report = "catch_up", self.run_catch_up(o)
        elif o["fanout_shapes"]:
            kind, report = "fanout", self.run_fanout(o)
        elif o["durable"]:
            kind, report = "durable", self.run_durable(o)
        else:
            kind = "llm" if o["llm"] else "modes"
            report = self.run_llm(o) if o["llm"] else self.run_modes(o, replica_writers)
        report["run"] = {"kind": kind, **made}
        self.stdout.write(results.table(report))
        if o["json_path"]:
            with open(o["json_path"], "w") as f:
                json.dump(report, f, indent=2)
            self.stdout.write(f"wrote {o['json_path']}")
        other_modes = ("durable", "fanout_shapes", "catch_up", "takeover", "frozen", "fleet", "storage")
        if o["plot_path"] and not any(o[mode] for mode in other_modes):
            plot(report, o["plot_path"])
            self.stdout.write(f"wrote {o['plot_path']}")

    def run_modes(self, o: dict[str, Any], replica_writers: tuple[int, ...]) -> dict[str, Any]:
        config = Config(
            modes=() if o["replica"] else MODES if o["mode"] == "all" else (o["mode"],),
            writers=o["writers"],
            writer_processes=o["writer_processes"],
            streams_per_writer=o["streams_per_writer"],
            readers=o["readers"],
            fanout=o["fanout"],
            duration=o["duration"],
            rate=o["rate"],
            ws=o["ws"],
            clients=o["clients"],
            pgbench=not (o["no_pgbench"] or o["replica"]),
            replica_writers=replica_writers if o["replica"] else (),
        )
        return run(config, say=self.say)

    def run_fanout(self, o: dict[str, Any]) -> dict[str, Any]:
        try:
            shapes = tuple(Shape.parse(text) for text in o["fanout_shapes"].split(","))
        except ValueError:
            raise CommandError(
                "--fanout-shapes must be shapes such as 1x1000x50,100x10x10, separated by commas"
            ) from None
        transports = tuple(t.strip() for t in o["transports"].split(","))
        servers = tuple(t.strip() for t in o["servers"].split(","))
        if set(transports) - set(TRANSPORTS) or set(servers) - set(SERVERS):
            raise CommandError(
                f"--transports must be some of {', '.join(TRANSPORTS)}; --servers of {', '.join(SERVERS)}"
            )
        config = FanoutConfig(
            shapes, transports, servers, o["duration"], not o["no_ceiling"], o["ceiling_writer"], o["idle"]
        )
        try:
            return run_fanout(config, say=self.say)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None

    def run_durable(self, o: dict[str, Any]) -> dict[str, Any]:
        if o["llm"] or o["replica"]:
            raise CommandError("--durable, --llm and --replica are three benchmarks: run them one at a time")
        try:
            rates = tuple(sorted(float(rate) for rate in o["paced_rate"].split(",")))
        except ValueError:
            raise CommandError(f"--paced-rate must be numbers of appends/s, not {o['paced_rate']!r}") from None
        if o["paced_streams"] < 0 or min(rates) <= 0 or o["read_megabytes"] <= 0:
            raise CommandError("--paced-streams must be at least 0, --paced-rate and --read-megabytes above 0")
        servers = tuple(t.strip() for t in o["servers"].split(","))
        if set(servers) - set(SERVERS):
            raise CommandError(f"--servers must be some of {', '.join(SERVERS)}")
        config = DurableConfig(
            seconds=o["duration"],
            connections=_counts(o, "connections"),
            paced_streams=o["paced_streams"],
            paced_rates=rates,
            read_megabytes=o["read_megabytes"],
            processes=_counts(o, "processes"),
            servers=servers,
        )
        try:
            return run_durable(config, say=self.say)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None

    def run_catch_up(self, o: dict[str, Any]) -> dict[str, Any]:
        servers = tuple(t.strip() for t in o["servers"].split(","))
        if set(servers) - set(SERVERS):
            raise CommandError(f"--servers must be some of {', '.join(SERVERS)}")
        if o["read_megabytes"] <= 0:
            raise CommandError("--read-megabytes must be above 0")
        config = CatchUpConfig(chunk_sizes=_counts(o, "catch_up"), megabytes=o["read_megabytes"], servers=servers)
        try:
            return run_catch_up(config, say=self.say)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None

    def run_llm(self, o: dict[str, Any]) -> dict[str, Any]:
        if o["replica"]:
            raise CommandError("--llm and --replica are two benchmarks: run them one at a time")
        methods = tuple(m.strip() for m in o["methods"].split(",") if m.strip())
        if not methods or set(methods) - {*METHODS, PACE}:
            raise CommandError(f"--methods must be some of {', '.join(METHODS)}, {PACE}, separated by commas")
        if o["find_max"] and not set(methods) & set(APPEND_METHODS):
            raise CommandError(f"--find-max needs an append method in --methods: {', '.join(APPEND_METHODS)}")
        if o["streams"] < 1 or o["tokens_per_second"] <= 0:
            raise CommandError("--streams must be at least 1 and --tokens-per-second positive")
        config = LlmConfig(
            methods=methods,
            streams=o["streams"],
            tokens_per_second=o["tokens_per_second"],
            writer_processes=o["writer_processes"],
            readers=o["readers"],
            duration=o["duration"],
            ws=o["ws"],
            find_max=o["find_max"],
        )
        return run_llm(config, say=self.say)

    def say(self, line: str) -> None:
        self.stdout.write(line)


def _counts(o: dict[str, Any], name: str) -> tuple[int, ...]:
    """An option of positive whole numbers separated by commas, such as 16,32,64."""
    try:
        counts = tuple(int(n) for n in o[name].split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        option = "--" + name.replace("_", "-")
        raise CommandError(f"{option} must be positive whole numbers separated by commas, such as 16,32,64")
    return counts
