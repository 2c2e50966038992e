"""A real engine, for real: llama.cpp's server with the Gemma 3 270M GGUF on the local node, placed by
the scheduler, launched by the agent, answering an OpenAI chat completion. Minutes, so it runs under
`make test-engines` (MODELFORGE_TEST_ENGINES=1), not in the fast suite."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from django.core.management import call_command

from apps.nodes.models import EnrollmentToken, Node
from apps.servers.models import ModelServer
from tests.fixtures import PYTHON, agent_environment, start_process, wait_until

pytestmark = [
    pytest.mark.engine,
    pytest.mark.stack,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.environ.get("MODELFORGE_TEST_ENGINES") != "1", reason="real engines run under `make test-engines`"
    ),
]


def test_a_gguf_model_is_served_by_llama_cpp_on_the_local_node(
    live_web, celery_worker_process, operator_client, tmp_path, settings
):
    pytest.importorskip("llama_cpp", reason="`make engines` installs llama-cpp-python")
    models = tmp_path / "models"
    call_command("install_demo_gguf", models_dir=models)
    (gguf,) = models.glob("*.gguf")
    _, token = EnrollmentToken.objects.mint(note="engine test")
    env = agent_environment(
        live_web.url,
        tmp_path / "state",
        secret=str(settings.CLUSTER_SECRET),
        name="local-node",
        token=token,
        models=models,
    )
    agent = start_process([PYTHON, "-m", "agent"], env, tmp_path / "agent.log")
    try:
        assert wait_until(lambda: Node.objects.filter(name="local-node", liveness="online").exists(), 30)
        settings.LOCAL_NODE = "local-node"  # the placement runs in this process
        body = {
            "name": "gemma",
            "profile": "llamacpp-gguf",
            "model": gguf.name,
            "weights_bytes": gguf.stat().st_size,
        }
        created = operator_client.post("/api/v1/servers", body, format="json")
        assert created.status_code == 201, created.content
        assert wait_until(
            lambda: ModelServer.objects.get(name="gemma").state in ("running", "failed"), 240
        ), agent.log()[-3000:]
        server = ModelServer.objects.get(name="gemma")
        assert server.state == "running", (server.failure_code, server.failure_message)
        chat = httpx.post(
            f"http://127.0.0.1:{server.port}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 16},
            timeout=120,
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["role"] == "assistant"
        completion = httpx.post(
            f"http://127.0.0.1:{server.port}/v1/completions",
            json={"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
            timeout=120,
        )
        assert completion.status_code == 200, completion.text
        assert completion.json()["usage"]["completion_tokens"] > 0
        assert completion.json()["choices"][0]["text"].strip(), completion.json()
    finally:
        os.killpg(agent.process.pid, signal.SIGTERM)
        agent.process.wait(30)
