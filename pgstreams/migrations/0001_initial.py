import django.db.models.deletion
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Stream',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('next_offset', models.BigIntegerField(default=0, editable=False, help_text='How many chunks have been written.')),
                ('label', models.CharField(blank=True, max_length=200)),
                ('metadata', models.JSONField(blank=True, default=dict)),
                ('owner', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='pgstreams', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'db_table': 'pgstreams_stream',
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='Chunk',
            fields=[
                ('pk', models.CompositePrimaryKey('stream', 'offset', blank=True, editable=False, primary_key=True, serialize=False)),
                ('offset', models.BigIntegerField()),
                ('data', models.TextField()),
                ('created_at', models.DateTimeField()),
                ('stream', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='chunks', to='pgstreams.stream')),
            ],
            options={
                'db_table': 'pgstreams_chunk',
                'ordering': ['stream', 'offset'],
            },
        ),
        # Deleting a stream deletes its chunks in the database, without Django loading them.
        migrations.RunSQL(
            sql=(
                "ALTER TABLE pgstreams_chunk ADD CONSTRAINT pgstreams_chunk_stream_fk "
                "FOREIGN KEY (stream_id) REFERENCES pgstreams_stream (id) ON DELETE CASCADE"
            ),
            reverse_sql="ALTER TABLE pgstreams_chunk DROP CONSTRAINT pgstreams_chunk_stream_fk",
        ),
        # Every write updates its stream's row: room on each page keeps those updates HOT.
        migrations.RunSQL(
            sql="ALTER TABLE pgstreams_stream SET (fillfactor = 70)",
            reverse_sql="ALTER TABLE pgstreams_stream RESET (fillfactor)",
        ),
    ]
