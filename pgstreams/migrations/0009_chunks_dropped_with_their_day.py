"""The trigger that deletes a deleted stream's chunks leaves those of the streams of one day when
the transaction names that day's range of ids (``pgstreams.day_dropped``, set by
``partitions.dropping_day``): a prune of a whole day deletes its streams as Django deletes them,
their chunks still there for the project's receivers and for any reader until then, and then
drops the day with them. Any other stream deleted in that transaction (a receiver's) loses its
chunks as before. Otherwise unchanged."""

from importlib import import_module

from django.db import migrations

FUNCTION_SQL = """
CREATE OR REPLACE FUNCTION pgstreams_delete_chunks() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        BEGIN
            TRUNCATE pgstreams_chunk;
        EXCEPTION WHEN object_in_use THEN  -- this statement truncates the chunks too
            DELETE FROM pgstreams_chunk;
        END;
    ELSIF coalesce(current_setting('pgstreams.day_dropped', true), '')
          ~ '^([0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}) ([0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12})$' THEN
        -- "low high": the day whose partition is dropped next, with its streams' chunks (any
        -- other value, as a session's own, is no day: the chunks go as always).
        DELETE FROM pgstreams_chunk WHERE stream_id = ANY (ARRAY(
            SELECT id FROM gone
            WHERE id < split_part(current_setting('pgstreams.day_dropped'), ' ', 1)::uuid
               OR id >= split_part(current_setting('pgstreams.day_dropped'), ' ', 2)::uuid));
    ELSE
        DELETE FROM pgstreams_chunk WHERE stream_id = ANY (ARRAY(SELECT id FROM gone));
    END IF;
    RETURN NULL;
END
$$
"""

# 0006's function, as it was (that migration's text, not a copy of it).
PREVIOUS_SQL = import_module("pgstreams.migrations.0006_chunks_deleted_by_trigger").FUNCTION_SQL.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
)


class Migration(migrations.Migration):
    dependencies = [("pgstreams", "0008_stream_ids_by_day")]

    operations = [migrations.RunSQL(FUNCTION_SQL, PREVIOUS_SQL)]
