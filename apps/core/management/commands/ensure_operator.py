"""Create the first operator login once, print it, and keep it in a 0600 file; later runs say where."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction


class Command(BaseCommand):
    help = "Create the first operator (staff superuser) login if none exists, and print it once."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="operator")
        parser.add_argument("--credentials-file", required=True, type=Path)

    def handle(self, *args: Any, username: str, credentials_file: Path, **options: Any) -> None:
        User = get_user_model()
        with transaction.atomic():
            if User.objects.select_for_update().filter(is_superuser=True, is_active=True).exists():
                where = f" (first login kept in {credentials_file})" if credentials_file.exists() else ""
                self.stdout.write(f"An operator login already exists{where}.")
                return
            password = secrets.token_urlsafe(18)
            User.objects.create_superuser(username=username, email="", password=password)
        credentials_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(credentials_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(f"username={username}\npassword={password}\n")
        self.stdout.write(
            self.style.SUCCESS(
                f"Created the operator login: username {username!r}, password {password!r} "
                f"(also kept in {credentials_file}, mode 0600). Change it in the admin."
            )
        )
