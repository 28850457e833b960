from django.db import migrations

# The planner's estimate of a stream's chunks, whatever the table held when it was last analyzed:
# stream ids about a twentieth of the rows (20 chunks a stream), so a stream's chunks are read
# through the primary key (stream_id, offset). Analyzed while a few streams held its chunks, the
# table looked like two streams' halves, and the listener's fetch scanned all of it once per
# stream. The override applies from the next ANALYZE, which follows at once; both take a lock that
# blocks neither reads nor writes.
FORWARD = [
    "ALTER TABLE pgstreams_chunk ALTER COLUMN stream_id SET (n_distinct = -0.05)",
    "ANALYZE pgstreams_chunk",
]
BACKWARD = [
    "ALTER TABLE pgstreams_chunk ALTER COLUMN stream_id RESET (n_distinct)",
    "ANALYZE pgstreams_chunk",
]


class Migration(migrations.Migration):
    dependencies = [("pgstreams", "0003_durable_streams")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
