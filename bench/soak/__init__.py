"""``manage.py pgstreams_soak``: every kind of writer and reader at once, in several processes,
under a randomized schedule of faults, then every stream checked against the table.

- ``run``: the coordinator. Makes a database on servers of its own, the proxies and a PgBouncer,
  keeps a set of streams open (each closed after a while, some over HTTP), injects the faults the
  seed draws, settles, has the record checked, and reports (a results-page report with ``--json``).
- ``processes``: which processes run, with which settings, and their supervision.
- ``faults``: the fault kinds, how each is injected, and the schedule.
- ``servers``: the two PostgreSQL servers, primary and standby, restarted, paused and switched over.
- ``writers``, ``readers``, ``clients``: the worker processes (Python writers, one of which starts
  generations; ``read``/``aread`` readers; WebSocket, SSE and Durable Streams clients and HTTP
  writers). The generations are written by ``db_worker`` processes (``bench.tasks``), and AI SDK
  answers read by ``node/soak_aisdk.mjs``.
- ``record``: what every process writes down (one JSON line per event, flushed as it happens, so a
  process killed with SIGKILL leaves what it did until then), and the streams it may use.
- ``check``: what the record must agree with in the table; every disagreement is an anomaly.
- ``settings``: the Django settings of the worker and server processes.

Not part of the installed app: it lives in the repository's ``bench`` app, beside the benchmark.
"""
