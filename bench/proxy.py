"""A loopback TCP proxy whose open connections can be frozen, cut mid-frame, or dropped: the
network faults of the fault tests and the soak.

``FreezingProxy`` listens on a free port of 127.0.0.1 and forwards every connection it accepts to
one upstream: a TCP (host, port) or a Unix socket path.

- ``freeze()`` stops the forwarding of every connection open at that moment, in both directions,
  without closing either socket: the client's kernel still sees a live TCP peer that never
  answers, as after a failover whose old primary vanished without a FIN or RST. Connections
  accepted later are forwarded normally. ``drop_frozen(age)`` closes the connections frozen at
  least ``age`` seconds ago (the upstream server then sees them go, and frees what they held).
- ``cut()`` ends every connection open at that moment abruptly: the next bytes the upstream
  sends on it are forwarded only in part, then both sockets are reset (a connection idle for
  ``CUT_IDLE`` seconds is reset as it is). The client sees half a frame, then a reset.

``rate`` (bytes a second, None: no bound) slows what a client sends to what a slow network would
carry, so that little of it waits in the kernel's buffers: a client process stopped (SIGSTOP) with
the proxy in it leaves its server waiting inside the message it was sending.

``proxy_for(settings_dict)`` builds one for a Django DATABASES entry and ``database_via`` returns
the entry that goes through it. It does not inspect the protocols it carries, simulate latency
or packet loss, nor unfreeze a connection.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from types import TracebackType
from typing import Any

Upstream = tuple[str, int] | str

POLL_INTERVAL = 0.1
CONNECT_TIMEOUT = 5.0
IO_TIMEOUT = 10.0
JOIN_TIMEOUT = 2.0
CHUNK = 65536
CUT_IDLE = 1.0  # seconds a cut connection may stay silent before it is reset without data


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.lock = threading.Lock()
        self.frozen_at: float | None = None
        self.cut_at: float | None = None
        self.closed = False
        self.thread: threading.Thread | None = None

    def close(self, reset: bool = False) -> None:
        """Close both sockets; ``reset`` sends an RST instead of a FIN."""
        self.closed = True
        for sock in (self.client, self.server):
            try:
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            except OSError:
                pass


class FreezingProxy:
    """A TCP proxy on 127.0.0.1 whose open connections can be frozen, cut or dropped (see the
    module docstring). ``max_connections`` bounds how many it accepts in its life (None: no
    bound), ``rate`` how many bytes a second it forwards at most from each client (None: no bound)."""

    def __init__(
        self, upstream: Upstream, *, max_connections: int | None = 1000, port: int = 0, rate: float | None = None
    ) -> None:
        self.upstream = upstream
        self.max_connections = max_connections
        self.rate = rate
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.settimeout(POLL_INTERVAL)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._stopping = threading.Event()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"freezing-proxy-accept:{self.port}", daemon=True
        )
        self.accepted_count = 0
        self.frozen_count = 0
        self.cut_count = 0

    def start(self) -> FreezingProxy:
        self._accept_thread.start()
        return self

    def _open_links(self) -> list[_Link]:
        with self._lock:
            return [link for link in self._links if not link.closed and link.frozen_at is None]

    def freeze(self) -> int:
        """Stop forwarding on every open connection, leaving its sockets open; return how many.

        Once this returns, no further byte crosses a frozen connection.
        """
        frozen = 0
        now = time.monotonic()
        for link in self._open_links():
            with link.lock:
                if not link.closed:
                    link.frozen_at = now
                    frozen += 1
        with self._lock:
            self.frozen_count += frozen
        return frozen

    def drop_frozen(self, age: float = 0.0) -> int:
        """Close (with a reset) the connections frozen at least ``age`` seconds ago; return how many."""
        now = time.monotonic()
        with self._lock:
            old = [link for link in self._links if link.frozen_at is not None and now - link.frozen_at >= age]
        dropped = 0
        for link in old:
            with link.lock:
                if not link.closed:
                    link.close(reset=True)
                    dropped += 1
        return dropped

    def cut(self) -> int:
        """Cut every open connection mid-frame (see the module docstring); return how many."""
        now = time.monotonic()
        links = self._open_links()
        for link in links:
            link.cut_at = now
        with self._lock:
            self.cut_count += len(links)
        return len(links)

    def close(self) -> None:
        """Stop accepting, close every connection (frozen ones too) and join the threads."""
        self._stopping.set()
        deadline = time.monotonic() + JOIN_TIMEOUT
        if self._accept_thread.is_alive():
            self._accept_thread.join(JOIN_TIMEOUT)
        self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        for link in links:
            if link.thread is not None and link.thread.is_alive():
                link.thread.join(max(0.0, deadline - time.monotonic()) + POLL_INTERVAL)

    def __enter__(self) -> FreezingProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(CONNECT_TIMEOUT)
                sock.connect(self.upstream)
            except OSError:
                sock.close()
                raise
            return sock
        return socket.create_connection(self.upstream, timeout=CONNECT_TIMEOUT)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set() and (
            self.max_connections is None or self.accepted_count < self.max_connections
        ):
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = self._connect_upstream()
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.settimeout(IO_TIMEOUT)
            link = _Link(client, server)
            with self._lock:
                self._links = [old for old in self._links if not old.closed]
                self.accepted_count += 1
                link.thread = threading.Thread(
                    target=self._pump,
                    args=(link,),
                    name=f"freezing-proxy-link:{self.port}#{self.accepted_count}",
                    daemon=True,
                )
                self._links.append(link)
            link.thread.start()

    def _pump(self, link: _Link) -> None:
        """Forward both ways until either side closes, the link freezes or is cut, or the proxy
        closes."""
        peer = {link.client: link.server, link.server: link.client}
        with selectors.DefaultSelector() as selector:
            for sock in peer:
                selector.register(sock, selectors.EVENT_READ)
            while not self._stopping.is_set():
                try:
                    ready = selector.select(POLL_INTERVAL)
                except (OSError, ValueError):
                    return
                for key, _ in ready:
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    forwarded = 0
                    with link.lock:
                        if link.frozen_at is not None or link.closed:
                            return
                        try:
                            data = source.recv(CHUNK)
                            if data and link.cut_at is not None and source is link.server:
                                link.client.sendall(data[: max(1, len(data) // 2)])
                                link.close(reset=True)
                                return
                            if data:
                                peer[source].sendall(data)
                                forwarded = len(data) if source is link.client else 0
                        except OSError:
                            data = b""
                        if not data:
                            link.close()
                            return
                    if forwarded and self.rate:
                        time.sleep(forwarded / self.rate)
                if link.frozen_at is not None:
                    return
                if link.cut_at is not None and time.monotonic() - link.cut_at >= CUT_IDLE:
                    with link.lock:
                        link.close(reset=True)
                    return


def proxy_for(settings_dict: dict[str, Any], **kwargs: Any) -> FreezingProxy:
    """A (not yet started) proxy to the server of a Django DATABASES entry.

    HOST is a socket directory (the upstream is ``<HOST>/.s.PGSQL.<PORT>``) or a host name; it
    must not be empty.
    """
    host = str(settings_dict.get("HOST") or "")
    port = int(settings_dict.get("PORT") or 5432)
    if not host or "," in host:
        raise ValueError(f"proxy_for needs one explicit HOST (a socket directory or a host), not {host!r}")
    if host.startswith("/"):
        return FreezingProxy(f"{host.rstrip('/')}/.s.PGSQL.{port}", **kwargs)
    return FreezingProxy((host, port), **kwargs)


def database_via(proxy: FreezingProxy, settings_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of a DATABASES entry that connects through ``proxy`` (OPTIONS lose host and port)."""
    options = {
        key: value
        for key, value in (settings_dict.get("OPTIONS") or {}).items()
        if key not in ("host", "hostaddr", "port")
    }
    return {**settings_dict, "HOST": "127.0.0.1", "PORT": str(proxy.port), "OPTIONS": options}
