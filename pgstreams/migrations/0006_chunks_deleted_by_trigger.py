"""A stream's chunks go with it by a trigger instead of a foreign key.

The foreign key checked every chunk inserted with a query of its own (a quarter of the append
path's statement at a thousand streams a batch: BENCHMARKS, issue 50), to prove what pgstreams'
own statements prove already: each inserts chunks only for stream rows it has locked in the same
statement (``writer``, ``batch``) or made in the same transaction (``durable.creates``). What the
key also did, deleting the chunks with their stream (``ON DELETE CASCADE``), the trigger does, for
a whole statement's streams at once, with the rights of the tables' owner as the key's cascade
had; a ``TRUNCATE`` of the streams truncates the chunks, as ``TRUNCATE ... CASCADE`` did (and
deletes what is left of them when the same statement truncated them too, as Django's ``flush``
does: none); a change of a stream's id is refused, as the key refused it. The key is dropped
first, so that the migration takes its strongest lock on both tables before anything else.
"""

from django.db import migrations

FUNCTION_SQL = """
CREATE FUNCTION pgstreams_delete_chunks() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        BEGIN
            TRUNCATE pgstreams_chunk;
        EXCEPTION WHEN object_in_use THEN  -- this statement truncates the chunks too
            DELETE FROM pgstreams_chunk;
        END;
    ELSE
        DELETE FROM pgstreams_chunk WHERE stream_id = ANY (ARRAY(SELECT id FROM gone));
    END IF;
    RETURN NULL;
END
$$
"""

# What the key also did: refuse a change of a stream's id, which would leave its chunks behind.
ID_FUNCTION_SQL = """
CREATE FUNCTION pgstreams_keep_stream_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a stream''s id cannot change: its chunks are keyed by it (stream %)', OLD.id
        USING ERRCODE = 'foreign_key_violation';
END
$$
"""

TRIGGERS_SQL = """
CREATE TRIGGER pgstreams_stream_deleted AFTER DELETE ON pgstreams_stream
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION pgstreams_delete_chunks();
CREATE TRIGGER pgstreams_stream_truncated AFTER TRUNCATE ON pgstreams_stream
    FOR EACH STATEMENT EXECUTE FUNCTION pgstreams_delete_chunks();
CREATE TRIGGER pgstreams_stream_id_kept BEFORE UPDATE OF id ON pgstreams_stream
    FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id) EXECUTE FUNCTION pgstreams_keep_stream_id()
"""


class Migration(migrations.Migration):
    dependencies = [
        ("pgstreams", "0005_open_generations"),
    ]

    operations = [
        migrations.RunSQL(
            sql=[
                "ALTER TABLE pgstreams_chunk DROP CONSTRAINT pgstreams_chunk_stream_fk",
                FUNCTION_SQL,
                ID_FUNCTION_SQL,
                TRIGGERS_SQL,
            ],
            reverse_sql=[
                "DELETE FROM pgstreams_chunk AS c"
                " WHERE NOT EXISTS (SELECT FROM pgstreams_stream AS s WHERE s.id = c.stream_id)",
                "ALTER TABLE pgstreams_chunk ADD CONSTRAINT pgstreams_chunk_stream_fk "
                "FOREIGN KEY (stream_id) REFERENCES pgstreams_stream (id) ON DELETE CASCADE",
                "DROP TRIGGER pgstreams_stream_id_kept ON pgstreams_stream",
                "DROP FUNCTION pgstreams_keep_stream_id()",
                "DROP TRIGGER pgstreams_stream_truncated ON pgstreams_stream",
                "DROP TRIGGER pgstreams_stream_deleted ON pgstreams_stream",
                "DROP FUNCTION pgstreams_delete_chunks()",
            ],
        ),
    ]
