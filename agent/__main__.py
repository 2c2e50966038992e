"""``python -m agent`` / ``modelforge-agent``."""

from __future__ import annotations

import sys

from agent import __version__


def main() -> int:
    sys.stderr.write(
        f"modelforge-agent {__version__}: enrollment and heartbeats are not built yet "
        "(see the nodes issue); exiting.\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
