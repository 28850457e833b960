"""The trigger that deletes a deleted stream's chunks leaves them when the transaction says they go
with their day's partition (``SET LOCAL pgstreams.day_dropped = 'on'``, ``partitions.py``): a
prune of a whole day deletes its streams as Django deletes them, their chunks still there for the
project's receivers and for any reader until then, and then drops the day. Otherwise unchanged."""

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
    ELSIF current_setting('pgstreams.day_dropped', true) = 'on' THEN
        NULL;  -- they go with their day's partition, dropped next
    ELSE
        DELETE FROM pgstreams_chunk WHERE stream_id = ANY (ARRAY(SELECT id FROM gone));
    END IF;
    RETURN NULL;
END
$$
"""

# 0006's function, as it was.
PREVIOUS_SQL = """
CREATE OR REPLACE FUNCTION pgstreams_delete_chunks() RETURNS trigger LANGUAGE plpgsql
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


class Migration(migrations.Migration):
    dependencies = [("pgstreams", "0008_stream_ids_by_day")]

    operations = [migrations.RunSQL(FUNCTION_SQL, PREVIOUS_SQL)]
