"""A sweep that moves a fleet writes less (issue 17, bench/heartbeats).

- A liveness transition of many nodes at once is one event row naming them all (``NodeEvent.nodes``),
  so ``NodeEvent.node`` may be empty.
- ``name`` and ``credential_hash`` stay unique through constraints of the same names PostgreSQL gave
  the columns' own, without the ``varchar_pattern_ops`` (``_like``) indexes ``unique=True`` adds.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0003_node_hot_updates"),
    ]

    operations = [
        migrations.AddField(
            model_name="nodeevent",
            name="nodes",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.UUIDField(), blank=True, editable=False, null=True, size=None
            ),
        ),
        migrations.AlterField(
            model_name="node",
            name="credential_hash",
            field=models.CharField(editable=False, max_length=64),
        ),
        migrations.AlterField(
            model_name="node",
            name="name",
            field=models.CharField(max_length=63),
        ),
        migrations.AlterField(
            model_name="nodeevent",
            name="node",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="events",
                to="nodes.node",
            ),
        ),
        migrations.AddConstraint(
            model_name="node",
            constraint=models.UniqueConstraint(fields=("name",), name="nodes_node_name_key"),
        ),
        migrations.AddConstraint(
            model_name="node",
            constraint=models.UniqueConstraint(
                fields=("credential_hash",), name="nodes_node_credential_hash_key"
            ),
        ),
    ]
