"""Inventory and telemetry: the NVML → heartbeat mapping, and the machine's real CPU/memory/shm figures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.accelerator import GpuTelemetryError, read_gpus
from agent.telemetry import read_host
from tests.agent.fakes import GIB, FakeGpu, fake_pynvml
from tests.agent.support import RecordingControlPlane, run_agent


def meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/meminfo")


def test_memory_held_by_the_agents_processes_is_managed_and_the_rest_external() -> None:
    nvml = fake_pynvml(
        gpus=[
            FakeGpu(
                name=b"NVIDIA GeForce RTX 4090",
                uuid=b"GPU-1111",
                total=24 * GIB,
                used=10 * GIB,
                utilization=63,
                temperature=71,
                # pid 4242 is ours (compute, and the same process again in graphics); 777 is Ollama.
                compute=[(4242, 6 * GIB), (777, 3 * GIB)],
                graphics=[(4242, 6 * GIB), (4243, None)],
            ),
            FakeGpu(
                name="NVIDIA RTX A6000",
                uuid="GPU-2222",
                total=48 * GIB,
                used=5 * GIB,
                compute=[(900, 5 * GIB)],
            ),
        ]
    )

    first, second = read_gpus(nvml, managed_pids={4242, 4243})

    assert first.as_payload() == {
        "index": 0,
        "uuid": "GPU-1111",
        "name": "NVIDIA GeForce RTX 4090",
        "memory_total_bytes": 24 * GIB,
        "memory_used_bytes": 10 * GIB,
        "memory_managed_bytes": 6 * GIB,
        "utilization_percent": 63,
        "temperature_c": 71,
    }
    assert first.external_pressure_bytes == 4 * GIB
    assert (second.name, second.uuid, second.memory_managed_bytes) == ("NVIDIA RTX A6000", "GPU-2222", 0)
    assert second.external_pressure_bytes == 5 * GIB


def test_with_no_managed_process_all_used_memory_is_external_pressure() -> None:
    nvml = fake_pynvml(gpus=[FakeGpu(used=7 * GIB, compute=[(1, 7 * GIB)])])

    (gpu,) = read_gpus(nvml, managed_pids=set())

    assert gpu.memory_managed_bytes == 0
    assert gpu.external_pressure_bytes == 7 * GIB


def test_external_pressure_is_never_negative() -> None:
    # NVML's per-process figures and its device total are sampled separately and can disagree.
    nvml = fake_pynvml(gpus=[FakeGpu(used=1 * GIB, compute=[(5, 2 * GIB)])])

    (gpu,) = read_gpus(nvml, managed_pids={5})

    assert gpu.external_pressure_bytes == 0


def test_a_gpu_that_cannot_list_processes_counts_everything_as_external() -> None:
    nvml = fake_pynvml(
        gpus=[
            FakeGpu(
                used=3 * GIB, compute=[(5, 3 * GIB)], failing_query="nvmlDeviceGetComputeRunningProcesses"
            )
        ]
    )

    (gpu,) = read_gpus(nvml, managed_pids={5})

    assert gpu.memory_managed_bytes == 0
    assert gpu.external_pressure_bytes == 3 * GIB


@pytest.mark.parametrize(
    "query",
    [
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
    ],
)
def test_a_listed_gpu_without_telemetry_is_an_error_not_a_guess(query: str) -> None:
    nvml = fake_pynvml(gpus=[FakeGpu(), FakeGpu(failing_query=query)])

    with pytest.raises(GpuTelemetryError) as raised:
        read_gpus(nvml)

    assert (raised.value.index, raised.value.query) == (1, query)


def test_cpu_figures_are_the_machines_own() -> None:
    host = read_host()

    assert host.memory_total_bytes == meminfo_kib("MemTotal") * 1024
    assert 0 < host.memory_available_bytes <= host.memory_total_bytes
    assert host.cpu_count == len(os.sched_getaffinity(0))
    shm = os.statvfs("/dev/shm")
    assert host.shm_total_bytes == shm.f_blocks * shm.f_frsize
    assert 0 <= host.shm_free_bytes <= host.shm_total_bytes
    assert host.load_1m >= 0


def test_a_cpu_heartbeat_carries_the_contracts_fields_with_real_figures(
    agent_env: dict[str, str], control_plane: RecordingControlPlane, tmp_path: Path
) -> None:
    models = tmp_path / "state" / "models"
    (models / "bge-small").mkdir(parents=True)
    (models / "bge-small" / "model.safetensors").write_bytes(b"weights")
    (models / "qwen2.5-7b-q4.gguf").write_bytes(b"GGUF")

    assert run_agent(agent_env, until=lambda: bool(control_plane.heartbeats)) == 0

    heartbeat = control_plane.heartbeats[0].json()
    assert set(heartbeat) == {
        "agent_version",
        "accelerator",
        "agent_url",
        "cpu",
        "memory",
        "shm",
        "gpus",
        "models_present",
    }
    assert heartbeat["accelerator"] == "cpu"
    assert heartbeat["agent_url"] == f"http://127.0.0.1:{agent_env['MODELFORGE_AGENT_PORT']}"
    assert heartbeat["memory"]["total_bytes"] == meminfo_kib("MemTotal") * 1024
    assert heartbeat["cpu"]["count"] == len(os.sched_getaffinity(0))
    assert isinstance(heartbeat["cpu"]["load_1m"], float)
    assert (
        heartbeat["shm"]["total_bytes"] == os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize
    )
    assert heartbeat["gpus"] == []
    assert heartbeat["models_present"] == [
        {"name": "bge-small", "kind": "weights_directory"},
        {"name": "qwen2.5-7b-q4.gguf", "kind": "gguf_file"},
    ]
