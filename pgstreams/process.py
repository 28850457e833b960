"""One object per process: made on first use, made anew in a forked child (the parent's threads
do not exist there, and its locks may be held), stopped when the interpreter exits. The
listener, the flusher, the thread pools and the watchdog each live in one."""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """The ``make()``-made object of this process, replaced when ``alive(it)`` turns false."""

    def __init__(
        self, make: Callable[[], T], stop: Callable[[T], None], alive: Callable[[T], bool] = lambda _: True
    ) -> None:
        self._make = make
        self._stop = stop
        self._alive = alive
        self._current: T | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)
        atexit.register(self.stop)

    def get(self) -> T:
        """This process's object, made now if there is none (or it is no longer alive)."""
        current = self._current
        if current is None or not self._alive(current):
            with self._lock:
                if self._current is None or not self._alive(self._current):
                    self._current = self._make()
                current = self._current
        return current

    def current(self) -> T | None:
        """This process's object if there is one, without making it."""
        return self._current

    def stop(self) -> None:
        """Stop and forget this process's object, if any; the next ``get()`` makes another."""
        with self._lock:
            current, self._current = self._current, None
        if current is not None:
            self._stop(current)

    def _forget(self) -> None:
        self._current = None
        self._lock = threading.Lock()
