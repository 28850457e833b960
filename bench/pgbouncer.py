"""A real PgBouncer in front of a database, for the tests and the soak, which must see what
pooling does.

``running_pgbouncer(settings_dict)`` starts Debian's ``pgbouncer`` on a free port of 127.0.0.1,
pooling every database of the server that ``settings_dict`` (a Django DATABASES entry) points at,
waits until it serves queries, yields a DATABASES entry that goes through it, and stops it after;
``PgBouncer`` is the same, stopped and started again on its port as the soak's faults ask.
Clients log in to PgBouncer without a password (``auth_type = trust``, loopback only); PgBouncer
logs in to the server with the entry's USER and PASSWORD. ``server_reset_query`` is left at its
default, which transaction pooling never runs, so session state (``SET``) leaks from one client
to the next: that is what production poolers do, and what tests built on this want to catch.

It does not configure TLS (neither to clients nor to the server), the admin console, HBA rules or
several upstream hosts, and it needs an explicit HOST: libpq's default socket directory is not
guessed. PgBouncer 1.18 does not track protocol-level prepared statements, so psycopg clients
that prepare (``prepare_threshold``) can collide on the shared server connection; Django's
default client-side binding cursors never prepare.
"""

from __future__ import annotations

import copy
import math
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

SEARCH_PATH = os.pathsep.join(filter(None, [os.environ.get("PATH"), "/usr/sbin", "/usr/local/sbin"]))
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0
# Connection parameters that describe the old server, or ask for TLS PgBouncer does not offer here.
HOST_SPECIFIC_OPTIONS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "service",
        "passfile",
        "target_session_attrs",
        "load_balance_hosts",
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslcrl",
        "sslpassword",
    }
)


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer", path=SEARCH_PATH)


def pgbouncer_missing() -> str | None:
    """Why PgBouncer cannot be started here (a ``pytest.skip`` reason), or None if it can."""
    if pgbouncer_binary() is None:
        return "pgbouncer is not installed (apt-get install -y pgbouncer)"
    return None


def _quote_value(value: str) -> str:
    """A value for a PgBouncer connection string, single-quoted when it needs to be."""
    if value and all(c.isalnum() or c in "/._-@:" for c in value):
        return value
    return "'" + value.replace("'", "''") + "'"


def _quote_field(value: str) -> str:
    """A field of PgBouncer's auth_file."""
    return '"' + value.replace('"', '""') + '"'


def _run_as_user(host: str) -> str | None:
    """Whom PgBouncer, which refuses to run as root, switches to; None when not root.

    Upstream on a Unix socket: the owner of the socket directory (the server's own user, who can
    reach it even when it is mode 0700), else ``postgres``. Upstream on TCP, or neither user
    exists: ``nobody``.
    """
    if os.geteuid() != 0:
        return None
    candidates: list[str] = []
    if host.startswith("/"):
        owner = Path(host).stat().st_uid
        if owner != 0:
            try:
                candidates.append(pwd.getpwuid(owner).pw_name)
            except KeyError:
                pass
        candidates.append("postgres")
    candidates.append("nobody")
    for name in candidates:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError(f"running as root, and none of {candidates} exists to run pgbouncer -u as")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join(text.splitlines()[-lines:]) or "(no output)"


def _config(host: str, port: int, listen_port: int, directory: Path, pool_mode: str, pool_size: int) -> str:
    return f"""\
[databases]
* = host={_quote_value(host)} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "userlist.txt"}
pool_mode = {pool_mode}
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 100
ignore_startup_parameters = extra_float_digits,options
pidfile = {directory / "pgbouncer.pid"}
"""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (PgBouncer's immediate shutdown), then SIGKILL if it is still there."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)


def _wait_until_serving(proc: subprocess.Popen[bytes], database: dict[str, Any], log: Path) -> None:
    """Return once PgBouncer listens and a query through it succeeds; else raise with its log.

    Only the wait for the listening socket is retried: once PgBouncer accepts connections, a
    failed query (a failed server login, say) is final.
    """
    deadline = time.monotonic() + START_TIMEOUT
    address = (database["HOST"], int(database["PORT"]))
    for _ in range(500):
        if proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with status {proc.returncode}:\n{_tail(log)}")
        try:
            socket.create_connection(address, timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not listen within {START_TIMEOUT:.0f}s:\n{_tail(log)}") from None
            time.sleep(0.02)
    else:
        raise RuntimeError(f"pgbouncer did not listen:\n{_tail(log)}")
    try:
        with psycopg.connect(
            host=database["HOST"],
            port=database["PORT"],
            dbname=database["NAME"],
            user=database["USER"],
            connect_timeout=max(2, math.ceil(deadline - time.monotonic())),
            autocommit=True,
        ) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise RuntimeError(f"a query through pgbouncer failed ({exc}):\n{_tail(log)}") from exc


class PgBouncer:
    """A PgBouncer in front of ``settings_dict``'s server, on a port of its own that stays the
    same when it is stopped and started again (``restart``): its clients find it where it was.
    ``entry`` is the DATABASES entry through it; ``close()`` stops it and removes its directory
    (config, auth file, log, pid file)."""

    def __init__(self, settings_dict: dict[str, Any], *, pool_mode: str = "transaction", pool_size: int = 1) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise RuntimeError(pgbouncer_missing())
        host = str(settings_dict.get("HOST") or "")
        if not host or "," in host:
            raise ValueError(f"PgBouncer needs one explicit HOST (a socket directory or a host), not {host!r}")
        user = str(settings_dict.get("USER") or "")
        if not user:
            raise ValueError("PgBouncer needs an explicit USER: its auth_file lists it")
        run_as = _run_as_user(host)
        self.directory = Path(tempfile.mkdtemp(prefix="pgstreams-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.pool_mode, self.pool_size, self.listen_port = pool_mode, pool_size, _free_port()
        config = self.directory / "pgbouncer.ini"
        self._write_config(settings_dict)
        userlist = self.directory / "userlist.txt"
        userlist.write_text(f"{_quote_field(user)} {_quote_field(str(settings_dict.get('PASSWORD') or ''))}\n")
        self.log = self.directory / "pgbouncer.log"
        for path in (self.directory, config, userlist):
            os.chmod(path, 0o700 if path.is_dir() else 0o600)
        if run_as is not None:
            account = pwd.getpwnam(run_as)
            for path in (self.directory, config, userlist):
                os.chown(path, account.pw_uid, account.pw_gid)
        self.command = [binary, *(["-u", run_as] if run_as else []), str(config)]
        self.entry = copy.deepcopy(settings_dict)
        self.entry["HOST"] = "127.0.0.1"
        self.entry["PORT"] = str(self.listen_port)
        options = settings_dict.get("OPTIONS") or {}
        self.entry["OPTIONS"] = {key: value for key, value in options.items() if key not in HOST_SPECIFIC_OPTIONS}

    def _write_config(self, settings_dict: dict[str, Any]) -> None:
        host, port = str(settings_dict.get("HOST") or ""), int(settings_dict.get("PORT") or 5432)
        config = _config(host, port, self.listen_port, self.directory, self.pool_mode, self.pool_size)
        (self.directory / "pgbouncer.ini").write_text(config)

    def start(self) -> None:
        """Start it, and return once it serves a query (RuntimeError with its log if it does not)."""
        with open(self.log, "ab") as sink:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        _wait_until_serving(self.proc, self.entry, self.log)

    def stop(self) -> None:
        """Stop it at once (SIGTERM): its clients' connections are cut."""
        if self.proc is not None:
            _stop(self.proc)

    def restart(self, down: float) -> None:
        """Stop it, wait ``down`` seconds, start it again on the same port."""
        self.stop()
        time.sleep(down)
        self.start()

    def retarget(self, settings_dict: dict[str, Any]) -> None:
        """Point it at another server of the same databases and user (a promoted standby, on
        one HOST as ``__init__`` asks), and start it again there on the same port."""
        self.stop()
        self._write_config(settings_dict)
        self.start()

    def logins(self) -> int:
        """Client logins so far, as its log counts them."""
        return self.log.read_text(errors="replace").count("login attempt")

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextmanager
def running_pgbouncer(
    settings_dict: dict[str, Any], *, pool_mode: str = "transaction", pool_size: int = 1
) -> Iterator[dict[str, Any]]:
    """Run PgBouncer in front of ``settings_dict``'s server; yield a DATABASES entry through it.

    The entry is a copy of ``settings_dict`` with HOST 127.0.0.1, PORT PgBouncer's port and
    OPTIONS without the host-specific (and TLS) parameters. On exit PgBouncer is stopped and its
    temporary directory (config, auth file, log, pid file) removed.
    """
    bouncer = PgBouncer(settings_dict, pool_mode=pool_mode, pool_size=pool_size)
    try:
        bouncer.start()
        yield bouncer.entry
    finally:
        bouncer.close()
