"""Run the gateway for an outside harness, routed to one upstream, on a throw-away stack.

    python bench/gateway/serve.py --upstream http://127.0.0.1:18080/v1 --port 9000 --key mfc_bench...

rag.embedding@1 and chat.general@1 both route to ``--upstream``; ``--key`` becomes a client credential
scoped to both. Used with ../shared/bench/gateway/run.sh (see README.md). Stops, with its stack, on
SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import route_to_one_backend, start_web, throwaway_stack


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--upstream", default=os.environ.get("BENCH_BACKEND_URL", "http://127.0.0.1:18080/v1")
    )
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--key", required=True, help="the client credential to accept (starts with mfc_)")
    args = parser.parse_args()
    upstream = urlsplit(args.upstream)
    with throwaway_stack() as (_workdir, env):
        from apps.clusters.models import ClientCredential, digest

        route_to_one_backend(upstream.hostname or "127.0.0.1", upstream.port or 80)
        ClientCredential.objects.create(
            name="bench",
            display_prefix=args.key[:12],
            secret_hash=digest(args.key),
            scopes=["chat.general@1", "rag.embedding@1"],
        )
        gunicorn = start_web(env, args.port, pin_core=None, new_session=False)
        signal.signal(signal.SIGTERM, lambda *_: gunicorn.terminate())
        return gunicorn.wait()


if __name__ == "__main__":
    sys.exit(main())
