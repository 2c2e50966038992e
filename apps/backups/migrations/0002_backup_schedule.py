"""The backup schedule as a django-celery-beat row (daily at 02:00 UTC), so the admin can edit it.

Entries in CELERY_BEAT_SCHEDULE are rewritten by beat at every start; this row is created once and left
to the operator afterwards.
"""

from django.db import migrations

NAME = "backup-database"


def create_schedule(apps, schema_editor):
    CrontabSchedule = apps.get_model("django_celery_beat", "CrontabSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    if PeriodicTask.objects.filter(name=NAME).exists():
        return
    crontab, _ = CrontabSchedule.objects.get_or_create(
        minute="0", hour="2", day_of_week="*", day_of_month="*", month_of_year="*", timezone="UTC"
    )
    PeriodicTask.objects.create(
        name=NAME,
        task="backups.scheduled_backup",
        crontab=crontab,
        description="Back up the control-plane database; verification follows automatically.",
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("backups", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_schedule, remove_schedule)]
