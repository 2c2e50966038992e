from django.apps import AppConfig


class EmbeddingMigrationsConfig(AppConfig):
    """Embedding migrations: staged cutovers of a consumer's alias from one embedding space to another.

    The label is ``embedding_migrations``, never ``migrations``: Django's own migration machinery owns
    that word (every app's ``migrations`` package, the ``django_migrations`` table).
    """

    name = "apps.embedding_migrations"
    label = "embedding_migrations"
    verbose_name = "Embedding migrations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.embedding_migrations import signals  # noqa: F401
