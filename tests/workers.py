"""Writers that run in their own process, for the multi-process tests.

``python -m tests.workers threads --stream ID --threads 16 --per-thread 50``: 16 threads write
one stream, some writes rolled back; prints one JSON list of the committed (offset, data) pairs.

``python -m tests.workers hang --stream ID --count 20 --setting FLUSH_INTERVAL=3600``: writes one chunk,
prints "first", waits for a line on stdin, writes the rest, prints "written", then sleeps with
their notifications still in its buffer until it is killed (or, with ``--os-exit``, leaves at
once through ``os._exit()``).

``python -m tests.workers exit --stream ID --count 5 --setting FLUSH_INTERVAL=3600``: writes one chunk and
waits for its flush (which goes at once), writes the rest, then exits normally, leaving the final
flush at exit to announce them.

``python -m tests.workers steady --stream ID --count 300 --pause 0.005``: writes at a steady pace,
then closes the stream and prints its flusher's stats as JSON.

``python -m tests.workers retrying --stream ID --count 300 --pause 0.01 [--producer]``: the same,
retrying each write that fails (through a server restart), printing each error as a JSON line;
``--producer`` writes as one idempotent producer, so that a retry never stores a chunk twice.

``python -m tests.workers answer --stream ID --count 200 --pause 0.05``: writes an AI SDK answer of
``--count`` words, one every ``--pause`` s (``pgstreams.aisdk.write_answer``), printing "writing"
once it has yielded its first word, and how the answer ended when it has (unless it is killed).

``python -m tests.workers read-exit --stream ID``: follows the stream with ``pgstreams.read()`` in
a thread, prints "reading", and exits normally at a line on stdin, the reader still waiting.

``python -m tests.workers via --stream R --write-stream W --via URL``: pgstreams' own connections
(listener, fetcher, flusher) go to URL (a proxy), Django's to the test database. Prints each
chunk of R as a JSON line with the time it arrived; on stdin, ``write X`` writes X to W,
``stats`` prints the flusher's stats, and ``exit`` prints them and exits normally (the final
flush runs at exit).

Any mode takes ``--setting KEY=JSON`` (repeatable): a PGSTREAMS setting for the process, such as
``--setting QUERY_TIMEOUT=2``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time

import django

from tests.helpers import Rollback


def threads(stream: str, n_threads: int, per_thread: int) -> None:
    from django.db import connection, transaction

    import pgstreams

    committed: list[tuple[int, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(n_threads)

    def run(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            data = f"t{t}-{i}"
            try:
                with transaction.atomic():
                    offset = pgstreams.write(stream, data)
                    if i % 7 == 3:  # some writers roll back
                        raise Rollback
            except Rollback:
                continue
            with lock:
                committed.append((offset, data))
        connection.close()

    workers = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    pgstreams.close(stream)
    print(json.dumps(sorted(committed)), flush=True)


def hang(stream: str, count: int, os_exit: bool) -> None:
    import os

    import pgstreams

    pgstreams.write(stream, "c0")  # notified at once: the flusher was idle
    print("first", flush=True)
    sys.stdin.readline()  # the test says when its reader has c0
    for i in range(1, count):
        pgstreams.write(stream, f"c{i}")  # announced only by the next flush, an hour away
    print("written", flush=True)
    if os_exit:
        os._exit(0)  # as a forked worker leaves: no atexit handlers, no final flush
    time.sleep(3600)


def exit_after(stream: str, count: int) -> None:
    import pgstreams
    from pgstreams import notify

    pgstreams.write(stream, "e0")
    deadline = time.monotonic() + 30
    while notify.flusher().stats.flushes < 1 and time.monotonic() < deadline:  # its flush goes at once
        time.sleep(0.01)
    for i in range(1, count):  # these wait for the interval, or the exit
        pgstreams.write(stream, f"e{i}")


def read_then_exit(stream: str) -> None:
    import pgstreams

    def read() -> None:
        with contextlib.suppress(pgstreams.StreamError):  # "the listener of this process was stopped"
            list(pgstreams.read(stream))

    threading.Thread(target=read, name="reader", daemon=True).start()
    print("reading", flush=True)
    sys.stdin.readline()


def steady(stream: str, count: int, pause: float) -> None:
    import pgstreams
    from pgstreams import notify

    for i in range(count):
        pgstreams.write(stream, f"s{i}")
        time.sleep(pause)
    pgstreams.close(stream)
    print(json.dumps({"done": count, "flusher": notify.flusher().stats.as_dict()}), flush=True)


def retrying(stream: str, count: int, pause: float, producer: bool) -> None:
    """Write through a server restart: an error is reported, the connection dropped, the same
    chunk written again until it succeeds; prints one JSON line per error, then a summary. With
    ``producer``, each write is batch i of one idempotent producer, and the summary counts the
    retries that found their batch already stored."""
    from django.db import Error, connections

    import pgstreams

    errors = []

    def attempt(action, *args, **kwargs):
        while True:
            try:
                return action(*args, **kwargs)
            except Error as exc:
                errors.append(f"{type(exc).__module__}.{type(exc).__name__}")
                print(json.dumps({"error": errors[-1], "message": str(exc).splitlines()[0][:200]}), flush=True)
                connections.close_all()
                time.sleep(0.2)

    duplicates = 0
    for i in range(count):
        batch = pgstreams.Producer("retrying", 0, i) if producer else None
        duplicates += attempt(pgstreams.write, stream, f"r{i}", producer=batch) is None
        time.sleep(pause)
    attempt(pgstreams.close, stream)
    print(json.dumps({"done": count, "errors": errors, "duplicates": duplicates}), flush=True)


def via(stream: str, write_stream: str) -> None:
    import pgstreams
    from pgstreams import notify

    output = threading.Lock()

    def say(message: dict) -> None:
        with output:
            print(json.dumps(message), flush=True)

    def follow() -> None:
        for chunk in pgstreams.read(stream, timeout=120):
            say({"offset": chunk.offset, "data": chunk.data, "at": time.monotonic()})

    threading.Thread(target=follow, daemon=True).start()
    for line in sys.stdin:
        command, _, data = line.strip().partition(" ")
        if command == "write":
            say({"wrote": pgstreams.write(write_stream, data, using="default")})
        elif command == "stats":
            say({"flusher": notify.flusher().stats.as_dict()})
        elif command == "exit":
            say({"flusher": notify.flusher().stats.as_dict(), "exiting_at": time.monotonic()})
            return


def answer(stream: str, count: int, pause: float) -> None:
    import asyncio

    from pgstreams import aisdk

    async def words():
        for i in range(count):
            yield f"word{i} "
            if i == 0:
                print("writing", flush=True)
            await asyncio.sleep(pause)

    print(asyncio.run(aisdk.write_answer(stream, words())), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="tests.workers")
    parser.add_argument("mode", choices=["threads", "hang", "exit", "steady", "retrying", "via", "answer", "read-exit"])
    parser.add_argument("--stream", required=True)
    parser.add_argument("--write-stream")
    parser.add_argument("--via", help="a database URL for pgstreams' own connections")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--per-thread", type=int, default=50)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.005)
    parser.add_argument(
        "--setting", action="append", default=[], metavar="KEY=JSON", help="a PGSTREAMS setting, e.g. QUERY_TIMEOUT=2"
    )
    parser.add_argument("--producer", action="store_true", help="retrying: write as an idempotent producer")
    parser.add_argument("--os-exit", action="store_true", help="hang: leave through os._exit() instead of sleeping")
    args = parser.parse_args(argv)

    from django.conf import settings

    overrides: dict = {}
    if args.via:
        from demo_project.database import from_url

        settings.DATABASES["via"] = from_url(args.via)  # before django.setup() configures connections
        overrides["DATABASE"] = "via"
    for setting in args.setting:
        key, _, value = setting.partition("=")
        overrides[key] = json.loads(value)
    django.setup()
    from django.test import override_settings

    override_settings(PGSTREAMS={**settings.PGSTREAMS, **overrides}).enable()  # for the life of the process
    if args.mode == "threads":
        threads(args.stream, args.threads, args.per_thread)
    elif args.mode == "hang":
        hang(args.stream, args.count, args.os_exit)
    elif args.mode == "exit":
        exit_after(args.stream, args.count)
    elif args.mode == "retrying":
        retrying(args.stream, args.count, args.pause, args.producer)
    elif args.mode == "answer":
        answer(args.stream, args.count, args.pause)
    elif args.mode == "read-exit":
        read_then_exit(args.stream)
    elif args.mode == "via":
        via(args.stream, args.write_stream)
    else:
        steady(args.stream, args.count, args.pause)


if __name__ == "__main__":
    main(sys.argv[1:])
