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
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import PYTHON, ROOT, throwaway_stack


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
        from django.utils import timezone

        from apps.clusters.models import (
            Capability,
            ClientCredential,
            Cluster,
            ClusterMember,
            RoutingTier,
            digest,
        )
        from apps.nodes.models import Node
        from apps.servers.models import ModelServer

        node = Node.objects.create(
            name="upstream",
            accelerator="cpu",
            credential_hash=digest("upstream"),
            liveness="online",
            last_heartbeat_at=timezone.now() + timezone.timedelta(days=1),
            agent_url=f"http://{upstream.hostname}:1",
        )
        server = ModelServer.objects.create(
            name="upstream",
            profile="test-echo",
            model="upstream",
            node=node,
            port=upstream.port,
            state="running",
        )
        cluster = Cluster.objects.create(name="bench")
        ClusterMember.objects.create(cluster=cluster, name="upstream", server=server)
        for name in ("rag.embedding@1", "chat.general@1"):
            RoutingTier.objects.create(capability=Capability.objects.create(name=name), cluster=cluster)
        ClientCredential.objects.create(
            name="bench",
            display_prefix=args.key[:12],
            secret_hash=digest(args.key),
            scopes=["chat.general@1", "rag.embedding@1"],
        )
        gunicorn = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "gunicorn",
                "-c",
                "python:modelforge.gunicorn_conf",
                "modelforge.asgi:application",
            ],
            cwd=ROOT,
            env={
                **env,
                "MODELFORGE_BIND": f"127.0.0.1:{args.port}",
                "MODELFORGE_WEB_WORKERS": "1",
                "MODELFORGE_LOG_LEVEL": "WARNING",
            },
        )
        signal.signal(signal.SIGTERM, lambda *_: gunicorn.terminate())
        return gunicorn.wait()


if __name__ == "__main__":
    sys.exit(main())
