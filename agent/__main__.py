"""``python -m agent`` / ``modelforge-agent``: logging and signals around ``agent.app.run``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType

from agent import __version__


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # httpx logs every request line at INFO; the agent logs what matters itself.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="modelforge-agent",
        description="The ModelForge node agent. Configured by MODELFORGE_AGENT_* environment variables "
        "(see agent/README.md).",
    )
    parser.add_argument("--version", action="version", version=f"modelforge-agent {__version__}")
    parser.parse_args(argv)

    configure_logging()
    from agent.app import run

    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logging.getLogger("agent").info("received %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return run(os.environ, stop)


if __name__ == "__main__":
    sys.exit(main())
