from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="installation",
            name="beat_seen_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="installation",
            name="beat_seen_hostname",
            field=models.CharField(blank=True, editable=False, max_length=255),
        ),
    ]
