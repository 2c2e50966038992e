"""The fleet's states: a liveness transition that takes many nodes at once moves one of these timestamps
instead of writing a row version per node (apps.nodes.liveness, bench/heartbeats 2026-12-06)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0005_node_fillfactor"),
    ]

    operations = [
        migrations.AddField(
            model_name="listeningclock",
            name="fleet_stale_before",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="listeningclock",
            name="fleet_offline_before",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
