"""``pgstreams_bench``: writers, readers and notification modes measured side by side in one run.

``run.py`` coordinates, ``procs.py`` holds the writer and reader processes, ``ceiling.py`` runs
pgbench for the server's own ceiling, ``ws.py`` the WebSocket mode, ``report.py`` the output;
``llm.py`` coordinates the LLM shape (``--llm``: token streams per write method) and
``llm_procs.py`` holds its writer and reader processes; ``cpu.py`` measures what each part of a
run (writer, Postgres, server) spends in CPU.
This package imports nothing at import time: the worker processes import it before Django is
set up.
"""
