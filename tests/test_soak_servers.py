"""The soak's two servers (``bench.soak.servers``): switched over, back and forth, the promoted
standby holds every commit, and clients listing both servers follow the primary."""

from __future__ import annotations

from bench.pgserver import connect
from bench.soak.servers import ServerPair


def test_switchovers_even_right_after_a_restart_keep_every_commit_and_clients_follow_the_primary() -> None:
    with ServerPair() as servers:
        with servers.connect_primary() as conn:
            conn.execute("CREATE DATABASE s")
        primary, standby = servers.database("s"), servers.standby_database("s")
        with connect(primary) as conn:
            conn.execute("CREATE TABLE t (i int)")
        for i in range(4):
            with connect(primary) as conn:
                conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
            if i % 2:
                servers.restart_primary(0.1)  # the standby streams again only after a moment
            was = servers.primary
            servers.switchover()
            assert servers.primary != was
            with connect(primary) as conn:
                count, recovering = conn.execute("SELECT count(*), pg_is_in_recovery() FROM t").fetchone()
            assert (count, recovering) == (100 * (i + 1), False)
        with connect(standby) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
