"""A real engine, for real: llama.cpp's server with the Gemma 3 270M GGUF on the local node, placed by
the scheduler, launched by the agent, answering an OpenAI chat completion. Minutes, so it runs under
`make test-engines` (MODELFORGE_TEST_ENGINES=1), not in the fast suite."""

from __future__ import annotations

import os
import signal

import pytest
from django.core.management import call_command
from openai import APIStatusError, OpenAI

from apps.clusters.models import Capability, ClientCredential, RoutingTier
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
            "profile": "llamacpp-gemma",
            "model": gguf.name,
            "weights_bytes": gguf.stat().st_size,
        }
        created = operator_client.post("/api/v1/servers", body, format="json")
        assert created.status_code == 201, created.content
        assert wait_until(
            lambda: ModelServer.objects.get(name="gemma").state in ("running", "failed"), 240
        ), agent.log()[-3000:]
        server = ModelServer.objects.get(name="gemma")
        # Running means a one-token chat completion answered (the profile's ready_check), not only
        # that the HTTP server was up.
        assert server.state == "running", (server.failure_code, server.failure_message)

        # Through the gateway, with the official client, as an application would call it.
        capability = Capability.objects.create(name="chat.gemma@1")
        RoutingTier.objects.create(capability=capability, server=server)
        _, secret = ClientCredential.objects.mint(name="engine test", scopes=["chat.gemma@1"])
        client = OpenAI(base_url=live_web.url + "/v1", api_key=secret, timeout=120)
        assert wait_until(lambda: _answers(client), 20)
        chat = client.chat.completions.create(
            model="chat.gemma@1",
            messages=[{"role": "user", "content": "Name one colour of the rainbow."}],
            max_tokens=16,
            temperature=0,
        )
        text = chat.choices[0].message.content or ""
        # The Gemma chat format: real generated words, not an empty answer in a fallback format.
        assert text.strip() and any(c.isalpha() for c in text), chat
        assert chat.usage is not None and chat.usage.completion_tokens > 0 and chat.usage.prompt_tokens > 5
        # The answer names the capability asked for, not llama.cpp's name for the GGUF file.
        assert chat.model == "chat.gemma@1"
        streamed = list(
            client.chat.completions.create(
                model="chat.gemma@1", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
            )
        )
        assert streamed and {chunk.model for chunk in streamed} == {"chat.gemma@1"}
        completion = client.completions.create(
            model="chat.gemma@1", prompt="The capital of France is", max_tokens=8, temperature=0
        )
        assert completion.usage is not None and completion.usage.completion_tokens > 0
        assert completion.choices[0].text.strip(), completion
        assert completion.model == "chat.gemma@1"
        # llama.cpp's server here runs without --embedding: its profile does not declare embeddings, and
        # the gateway says so itself rather than passing on whatever the engine would answer.
        with pytest.raises(APIStatusError) as refused:
            client.embeddings.create(model="chat.gemma@1", input="x")
        assert refused.value.status_code == 404
        assert refused.value.response.json()["code"] == "ENDPOINT_NOT_SERVED"
        _health_answers_while_the_engine_computes(server, client)
    finally:
        os.killpg(agent.process.pid, signal.SIGTERM)
        agent.process.wait(30)


def _answers(client: OpenAI) -> bool:
    """The gateway's routing table has the new binding (it refreshes within a second or two)."""
    try:
        client.chat.completions.create(
            model="chat.gemma@1", messages=[{"role": "user", "content": "Hi"}], max_tokens=1
        )
    except APIStatusError:
        return False
    return True


def _health_answers_while_the_engine_computes(server: ModelServer, client: OpenAI) -> None:
    """The profile's health path answers while the engine computes a long prompt: the gateway probes it
    every 2 s with a 1 s timeout, and a path that waits for the model (llama-cpp-python's /v1/models takes
    the model's lock) took every busy engine out of rotation under load (503 NO_HEALTHY_BACKEND; found by
    bench/routing)."""
    import threading
    import time

    import httpx

    from apps.servers.profiles import runtime_profiles

    path = runtime_profiles()[server.profile].launch.health_path
    long_prompt = "Summarise the following notes. " + "The river rose and the town moved uphill. " * 120
    busy = threading.Thread(
        target=lambda: client.chat.completions.create(
            model="chat.gemma@1", messages=[{"role": "user", "content": long_prompt}], max_tokens=64
        )
    )
    busy.start()
    try:
        time.sleep(1.0)  # the engine is evaluating the prompt (seconds on a CPU)
        assert busy.is_alive()
        answered = []
        for _ in range(3):
            started = time.monotonic()
            response = httpx.get(f"http://127.0.0.1:{server.port}{path}", timeout=5)
            answered.append((response.status_code, time.monotonic() - started))
        assert busy.is_alive(), "the long request ended before the probes: nothing was measured"
        assert all(status == 200 and took < 1.0 for status, took in answered), answered
    finally:
        busy.join(120)
