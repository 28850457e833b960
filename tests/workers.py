"""Writers that run in their own process, for the multi-process tests.

``python -m tests.workers threads --stream ID --threads 16 --per-thread 50``: 16 threads write
one stream, some writes rolled back; prints one JSON list of the committed (offset, data) pairs.

``python -m tests.workers hang --stream ID --count 20 --flush-interval 3600``: writes one chunk,
prints "first", waits for a line on stdin, writes the rest, prints "written", then sleeps with
their notifications still in its buffer until it is killed.

``python -m tests.workers exit --stream ID --count 5 --flush-interval 3600``: writes, then exits
normally, leaving the final flush at exit to announce the last writes.

``python -m tests.workers steady --stream ID --count 300 --pause 0.005``: writes at a steady pace,
then closes the stream and prints its flusher's stats as JSON.

``python -m tests.workers retrying --stream ID --count 300 --pause 0.01``: the same, retrying each
write that fails (through a server restart), printing each error as a JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import django


class Rollback(Exception):
    pass


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


def hang(stream: str, count: int) -> None:
    import pgstreams

    pgstreams.write(stream, "c0")  # notified at once: the flusher was idle
    print("first", flush=True)
    sys.stdin.readline()  # the test says when its reader has c0
    for i in range(1, count):
        pgstreams.write(stream, f"c{i}")  # announced only by the next flush, an hour away
    print("written", flush=True)
    time.sleep(3600)


def exit_after(stream: str, count: int) -> None:
    import pgstreams

    for i in range(count):
        pgstreams.write(stream, f"e{i}")


def steady(stream: str, count: int, pause: float) -> None:
    import pgstreams
    from pgstreams import notify

    for i in range(count):
        pgstreams.write(stream, f"s{i}")
        time.sleep(pause)
    pgstreams.close(stream)
    print(json.dumps({"done": count, "flusher": dict(notify.flusher().stats)}), flush=True)


def retrying(stream: str, count: int, pause: float) -> None:
    """Write through a server restart: an error is reported, the connection dropped, the same
    chunk written again until it succeeds; prints one JSON line per error, then a summary."""
    from django.db import Error, connections

    import pgstreams

    errors = []

    def attempt(action, *args):
        while True:
            try:
                return action(*args)
            except Error as exc:
                errors.append(f"{type(exc).__module__}.{type(exc).__name__}")
                print(json.dumps({"error": errors[-1], "message": str(exc).splitlines()[0][:200]}), flush=True)
                connections.close_all()
                time.sleep(0.2)

    for i in range(count):
        attempt(pgstreams.write, stream, f"r{i}")
        time.sleep(pause)
    attempt(pgstreams.close, stream)
    print(json.dumps({"done": count, "errors": errors}), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="tests.workers")
    parser.add_argument("mode", choices=["threads", "hang", "exit", "steady", "retrying"])
    parser.add_argument("--stream", required=True)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--per-thread", type=int, default=50)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.005)
    parser.add_argument("--flush-interval", type=float, default=None)
    args = parser.parse_args(argv)

    django.setup()
    if args.flush_interval is not None:
        from django.conf import settings

        settings.PGSTREAMS = {**settings.PGSTREAMS, "FLUSH_INTERVAL": args.flush_interval}
    if args.mode == "threads":
        threads(args.stream, args.threads, args.per_thread)
    elif args.mode == "hang":
        hang(args.stream, args.count)
    elif args.mode == "exit":
        exit_after(args.stream, args.count)
    elif args.mode == "retrying":
        retrying(args.stream, args.count, args.pause)
    else:
        steady(args.stream, args.count, args.pause)


if __name__ == "__main__":
    main(sys.argv[1:])
