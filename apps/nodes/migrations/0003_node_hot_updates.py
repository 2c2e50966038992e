"""Node rows updated in place (HOT): no index on the columns a heartbeat or a sweep changes, and pages
kept under half full so every row of a page can get its new version on that page.

The fillfactor applies to pages filled from now on; existing pages make room as their rows are updated
(or at once with ``VACUUM FULL nodes_node``, which locks the table while it runs).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0002_listeningclock"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="node", name="nodes_liveness_idx"),
        migrations.RunSQL(
            "ALTER TABLE nodes_node SET (fillfactor = 45)",
            reverse_sql="ALTER TABLE nodes_node RESET (fillfactor)",
        ),
    ]
