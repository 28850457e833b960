"""A stream's chunks go with it by a trigger instead of a foreign key.

The foreign key checked every chunk inserted with a query of its own (a quarter of the append
path's statement at a thousand streams a batch: BENCHMARKS, issue 50), to prove what pgstreams'
own statements prove already: each inserts chunks only for stream rows it has locked in the same
statement (``writer``, ``batch``) or made in the same transaction (``durable.creates``). What the
key also did, deleting the chunks with their stream (``ON DELETE CASCADE``), the trigger does,
for a whole statement's streams at once; a ``TRUNCATE`` of the streams empties the chunks, where
the key refused it (truncate both tables together, as Django's ``flush`` does, and there is
nothing left to delete).
"""

from django.db import migrations

FUNCTION_SQL = """
CREATE FUNCTION pgstreams_delete_chunks() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM pgstreams_chunk;  -- not TRUNCATE: a TRUNCATE of both tables (Django's flush) runs this
    ELSE
        DELETE FROM pgstreams_chunk WHERE stream_id = ANY (ARRAY(SELECT id FROM gone));
    END IF;
    RETURN NULL;
END
$$
"""

TRIGGERS_SQL = """
CREATE TRIGGER pgstreams_stream_deleted AFTER DELETE ON pgstreams_stream
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION pgstreams_delete_chunks();
CREATE TRIGGER pgstreams_stream_truncated AFTER TRUNCATE ON pgstreams_stream
    FOR EACH STATEMENT EXECUTE FUNCTION pgstreams_delete_chunks()
"""


class Migration(migrations.Migration):
    dependencies = [
        ("pgstreams", "0005_open_generations"),
    ]

    operations = [
        migrations.RunSQL(
            sql=[FUNCTION_SQL, TRIGGERS_SQL, "ALTER TABLE pgstreams_chunk DROP CONSTRAINT pgstreams_chunk_stream_fk"],
            reverse_sql=[
                "DELETE FROM pgstreams_chunk AS c"
                " WHERE NOT EXISTS (SELECT FROM pgstreams_stream AS s WHERE s.id = c.stream_id)",
                "ALTER TABLE pgstreams_chunk ADD CONSTRAINT pgstreams_chunk_stream_fk "
                "FOREIGN KEY (stream_id) REFERENCES pgstreams_stream (id) ON DELETE CASCADE",
                "DROP TRIGGER pgstreams_stream_truncated ON pgstreams_stream",
                "DROP TRIGGER pgstreams_stream_deleted ON pgstreams_stream",
                "DROP FUNCTION pgstreams_delete_chunks()",
            ],
        ),
    ]
