"""A stream's id is made by ``partitions.new_stream_id``: time-ordered (UUIDv7) with
``DAY_PARTITIONS``, random as before without. Django makes ids: the table does not change."""

import pgstreams.partitions
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pgstreams', '0007_runs'),
    ]

    operations = [
        migrations.AlterField(
            model_name='stream',
            name='id',
            field=models.UUIDField(default=pgstreams.partitions.new_stream_id, editable=False, primary_key=True, serialize=False),
        ),
    ]
