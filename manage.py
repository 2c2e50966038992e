#!/usr/bin/env python
"""Django's command-line utility for ModelForge."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelforge.settings")
    import django

    django.setup()
    from modelforge.startup import enforce

    # Every command is an entry point: production refuses bad configuration here too (exit 3).
    enforce("manage.py " + (sys.argv[1] if len(sys.argv) > 1 else ""))
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
