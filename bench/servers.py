"""The ASGI servers pgstreams supports, and how each serves an application on a loopback port in
one process: daphne (the default, the demo's), uvicorn (with httptools, uvloop and its
websockets-sansio implementation) and granian. Used by the benchmark and the tests alike."""

from __future__ import annotations

import sys

SERVERS = ("daphne", "uvicorn", "granian")


def server_command(server: str, app: str, port: int) -> list[str]:
    """The command line that serves ``app`` (``module:attribute``) with ``server`` on ``port``."""
    if server == "daphne":
        return [sys.executable, "-m", "daphne", "-v", "0", "-b", "127.0.0.1", "-p", str(port), app]
    if server == "uvicorn":
        return [
            *(sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)),
            *("--ws", "websockets-sansio", "--http", "httptools", "--loop", "uvloop"),
            *("--lifespan", "off", "--log-level", "warning"),
        ]
    if server == "granian":
        return [
            *(sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port)),
            *("--workers", "1", "--loop", "uvloop", "--log-level", "warning", app),
        ]
    raise ValueError(f"server must be one of {', '.join(SERVERS)}, not {server!r}")
