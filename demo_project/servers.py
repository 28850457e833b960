"""The ASGI servers pgstreams supports, and how each serves an application on a loopback port in
one process: daphne (the default, the demo's), uvicorn (with httptools, uvloop and its
websockets-sansio implementation) and granian. Used by the demo, the benchmark and the tests."""

from __future__ import annotations

import sys

from daphne.endpoints import build_endpoint_description_strings

SERVERS = ("daphne", "uvicorn", "granian")
# Connections waiting to be accepted that the kernel holds (net.core.somaxconn caps it). daphne's
# own default, twisted's 50, drops the SYNs of a connect storm past it (a thousand browsers
# reconnecting after a deploy), and their clients try again 1, 3 and 7 s later; uvicorn's default
# is 2,048 and granian's 1,024.
DAPHNE_BACKLOG = 1024
# Requests granian serves at once in a worker; its default (the backlog, 1,024) counts every open
# WebSocket and SSE response, and the 1,025th waits until one ends: 2,000 idle SSE subscribers
# took 302 s to connect (the clients' own header timeout).
GRANIAN_BACKPRESSURE = 16384
# Seconds granian gives a worker to stop before it kills it. Without it granian waits forever, and
# a worker can hang as it stops: its runtime's threads and the GIL wait on each other
# (emmett-framework/granian#875; a test's server once never exited after a connect storm here).
GRANIAN_KILL_TIMEOUT = 5


def daphne_endpoint(host: str, port: int) -> str:
    """daphne's endpoint (``-e``) for ``host:port``, with a listen backlog of DAPHNE_BACKLOG."""
    (endpoint,) = build_endpoint_description_strings(host=host, port=port)
    return f"{endpoint}:backlog={DAPHNE_BACKLOG}"


def server_command(server: str, app: str, port: int) -> list[str]:
    """The command line that serves ``app`` (``module:attribute``) with ``server`` on ``port``."""
    if server == "daphne":
        return [sys.executable, "-m", "daphne", "-v", "0", "-e", daphne_endpoint("127.0.0.1", port), app]
    if server == "uvicorn":
        return [
            *(sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)),
            *("--ws", "websockets-sansio", "--http", "httptools", "--loop", "uvloop"),
            *("--lifespan", "off", "--log-level", "warning"),
        ]
    if server == "granian":
        return [
            *(sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port)),
            *("--workers", "1", "--loop", "uvloop", "--backpressure", str(GRANIAN_BACKPRESSURE)),
            *("--workers-kill-timeout", str(GRANIAN_KILL_TIMEOUT)),
            *("--log-level", "warning", app),
        ]
    raise ValueError(f"server must be one of {', '.join(SERVERS)}, not {server!r}")
