"""Jobs get a random part in their checkpoint key (`Job.checkpoint_key`); jobs that exist
already keep an empty one, so their checkpoints stay under their bare id."""

from django.db import migrations, models

import jobs.models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_checkpoint_storage"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="checkpoint_salt",
            field=models.CharField(blank=True, default="", editable=False, max_length=16),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="job",
            name="checkpoint_salt",
            field=models.CharField(
                blank=True,
                default=jobs.models.new_checkpoint_salt,
                editable=False,
                help_text="Random part of the job's name in the checkpoint stores (empty on jobs "
                "submitted before it existed).",
                max_length=16,
            ),
        ),
    ]
