"""Room on every node-table page for a new version of each row on it: a whole-fleet sweep's UPDATE is HOT.

A sweep that moves every node at once (a network split, the control plane coming back after the offline
limit) rewrote each row onto another page with an entry in each of the table's three indexes: most of
the sweep's time (bench/heartbeats, 2026-12-01). With half of each page left free at insert, every row
on a page can be rewritten in place. ``ALTER TABLE ... SET`` does not rewrite: a table that already has
rows takes the setting as rows are re-written onto new pages (``VACUUM FULL nodes_node`` applies it at
once, at the cost of a lock on the table while it runs).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0004_fleet_events_and_fewer_indexes"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE nodes_node SET (fillfactor = 50)",
            reverse_sql="ALTER TABLE nodes_node RESET (fillfactor)",
        ),
    ]
