"""Mint a single-use enrollment token and print it (once) on stdout."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.nodes.models import EnrollmentToken


class Command(BaseCommand):
    help = "Mint a single-use enrollment token for one agent; prints the token, which is not stored."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--note", default="")
        parser.add_argument("--ttl", type=int, default=None, help="lifetime in seconds")

    def handle(self, *args: Any, note: str, ttl: int | None, **options: Any) -> None:
        if ttl is not None and not 60 <= ttl <= 30 * 86400:
            raise CommandError("--ttl must be between 60 seconds and 30 days")
        token, plain = EnrollmentToken.objects.mint(note=note, ttl_seconds=ttl)
        self.stderr.write(
            f"Minted token {token.display_prefix}… (expires {token.expires_at:%Y-%m-%d %H:%M} UTC)"
        )
        self.stdout.write(plain)
