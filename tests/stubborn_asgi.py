"""The raw ASGI application in a process that cannot end by itself: a thread that is not a daemon,
started at import, sleeps for an hour (Python waits for such threads before it exits). For
tests/test_servers.py, whose server must stop around it all the same."""

import threading
import time

from bench.raw_asgi import application

threading.Thread(target=time.sleep, args=(3600,), name="stubborn", daemon=False).start()

__all__ = ["application"]
