"""Node rows updated in place (HOT): no index on the columns a heartbeat or a sweep changes.

``nodes_liveness_idx (liveness, last_heartbeat_at)`` covered the column every heartbeat writes, so no
heartbeat could be a HOT update: each wrote a new entry into every index of the table.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0002_listeningclock"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="node", name="nodes_liveness_idx"),
    ]
