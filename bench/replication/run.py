"""Replication benchmark: an artifact copied to an agent on this machine, against a plain ``cp``.

    python bench/replication/run.py [--size-mb 2048]

Makes a ``--size-mb`` file, acquires it as an artifact (digest recorded), starts the web application
and a real agent (enrolled with a token), then times the replication end to end: the agent pulls the
file from the control plane's store over HTTP with the node credential, verifies its digest (the BLAKE3
recorded at acquisition; SHA-256 for an artifact recorded without one), and moves it into its models
directory; the control plane confirms with the presence check. The baseline
is ``cp`` of the same file (page cache warm for both), the physical limit here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import PYTHON, ROOT, free_port, interpreter, start_web, throwaway_stack

TICK = os.sysconf("SC_CLK_TCK")


def group_cpu(pgid: int) -> float:
    """User + system CPU seconds of every live process in the process group ``pgid``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="uncounted rounds first (memory touched for the first time is slow here)",
    )
    args = parser.parse_args()
    print(f"interpreter: {interpreter()}")
    with throwaway_stack() as (workdir, env):
        from django.conf import settings

        from apps.artifacts import acquisition, replication
        from apps.artifacts.models import Artifact, Replica
        from apps.nodes.models import EnrollmentToken, Node

        settings.ARTIFACT_STORE = workdir / "store"
        settings.ARTIFACT_LOCAL_ROOTS = [workdir / "source"]
        source = workdir / "source" / "weights.safetensors"
        source.parent.mkdir(parents=True)
        block = os.urandom(1 << 20)
        with source.open("wb") as writer:
            for _ in range(args.size_mb):
                writer.write(block)
        size = source.stat().st_size

        artifact = Artifact.objects.create(name="bench", source_kind="local", locator=str(source.parent))
        acquisition.acquire(artifact)
        artifact.refresh_from_db()
        assert artifact.state == "ready", artifact.checks

        cp_times: list[float] = []
        replica_times: list[float] = []
        web_cpu: list[float] = []
        agent_cpu: list[float] = []
        port, agent_port = free_port(), free_port()
        web = start_web(
            {**env, "MODELFORGE_ARTIFACT_STORE": str(settings.ARTIFACT_STORE)}, port, workers=1, pin_core=None
        )
        _, token = EnrollmentToken.objects.mint(note="bench")
        agent_env = {
            **{k: v for k, v in env.items() if not k.startswith("MODELFORGE_AGENT")},
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": f"http://127.0.0.1:{port}",
            "MODELFORGE_AGENT_ENROLLMENT_TOKEN": token,
            "MODELFORGE_AGENT_STATE_VOLUME": str(workdir / "agent"),
            "MODELFORGE_AGENT_MODELS_DIR": str(workdir / "agent-models"),
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_CLUSTER_SECRET": env["MODELFORGE_CLUSTER_SECRET"],
            "MODELFORGE_AGENT_LISTEN_HOST": "127.0.0.1",
            "MODELFORGE_AGENT_ADVERTISE_HOST": "127.0.0.1",
            "MODELFORGE_AGENT_PORT": str(agent_port),
            "MODELFORGE_AGENT_HEARTBEAT_INTERVAL": "1",
            "MODELFORGE_AGENT_NAME": "bench-node",
        }
        agent = subprocess.Popen(
            [PYTHON, "-m", "agent"],
            cwd=ROOT,
            env=agent_env,
            start_new_session=True,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while not Node.objects.filter(name="bench-node", liveness="online").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the agent did not come online")
                time.sleep(0.3)
            node = Node.objects.get(name="bench-node")
            models_dir = workdir / "agent-models"
            for round_number in range(1 - args.warmup, args.rounds + 1):
                # The baseline and the replication alternate, each writing a new file that is removed
                # afterwards, so both meet the same page-cache state (on this VM, writing into memory never
                # touched before is several times slower than into reused memory).
                started = time.perf_counter()
                shutil.copyfile(source, workdir / "cp-baseline")
                cp_times.append(time.perf_counter() - started)
                (workdir / "cp-baseline").unlink()
                replica = Replica.objects.create(artifact=artifact, node=node, name="bench", total_bytes=size)
                cpu_before = group_cpu(web.pid), group_cpu(agent.pid)
                started = time.perf_counter()
                assert replication.start(replica)
                asked = time.perf_counter() - started
                # Polled at 4 Hz (the product's watch task looks every second); the time taken is the
                # request to the agent plus the agent's own start-to-present time (fetched, every digest
                # verified, placed), which the control plane records as copy_seconds.
                while not replication.check(
                    Replica.objects.select_related("artifact", "node").get(pk=replica.pk)
                ):
                    time.sleep(0.25)
                replica.refresh_from_db()
                assert replica.state == "present" and replica.copy_seconds, replica.reason
                replica_times.append(asked + replica.copy_seconds)
                web_cpu.append(group_cpu(web.pid) - cpu_before[0])
                agent_cpu.append(group_cpu(agent.pid) - cpu_before[1])
                replica.delete()
                shutil.rmtree(models_dir / "bench", ignore_errors=True)
                mb = size / 2**20
                share = 100 * cp_times[-1] / replica_times[-1]
                if round_number < 1:
                    cp_s, took = cp_times.pop(), replica_times.pop()
                    web_cpu.pop(), agent_cpu.pop()
                    print(f"warm-up: cp {mb / cp_s:,.0f}, replication {mb / took:,.0f} MiB/s", flush=True)
                    continue
                print(
                    f"round {round_number}: cp {mb / cp_times[-1]:,.0f} MiB/s, replication "
                    f"{mb / replica_times[-1]:,.0f} MiB/s ({share:.0f} % of cp); CPU s per GiB: control "
                    f"plane {web_cpu[-1] * 1024 / mb:.2f}, agent {agent_cpu[-1] * 1024 / mb:.2f}",
                    flush=True,
                )
        finally:
            for process in (agent, web):
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(30)
        mb = size / 2**20
        cp_s, took = statistics.median(cp_times), statistics.median(replica_times)
        verified = "BLAKE3" if all("blake3" in f for f in artifact.files) else "SHA-256"  # as the agent does
        print(f"replicating a {mb:,.0f} MiB artifact to an agent here ({verified} verified), medians")
        print(f"  cp baseline   {cp_s:6.2f} s   {mb / cp_s:8,.0f} MiB/s")
        print(f"  replication   {took:6.2f} s   {mb / took:8,.0f} MiB/s   = {100 * cp_s / took:.0f} % of cp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
