"""A stand-in for the ``pynvml`` module: NVML replaced at exactly the boundary the agent imports."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3


class FakeNVMLError(Exception):
    """Plays ``pynvml.NVMLError``: the agent catches whatever the module it was handed calls that."""


@dataclass
class FakeGpu:
    name: str | bytes = "NVIDIA RTX A6000"
    uuid: str | bytes = "GPU-00000000-0000-0000-0000-000000000000"
    total: int = 48 * GIB
    used: int = 0
    utilization: int = 0
    temperature: int = 40
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    failing_query: str | None = None


@dataclass
class NvmlCalls:
    init: int = 0
    shutdown: int = 0


def fake_pynvml(gpus: list[FakeGpu] | None = None, init_error: str | None = None) -> Any:
    """A module with the pynvml functions the agent uses, answering from ``gpus``."""
    devices = list(gpus or [])
    calls = NvmlCalls()
    module: Any = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError
    module.NVML_TEMPERATURE_GPU = 0
    module.calls = calls

    def check(gpu: FakeGpu, query: str) -> None:
        if gpu.failing_query == query:
            raise FakeNVMLError("GPU is lost")

    def nvml_init() -> None:
        calls.init += 1
        if init_error:
            raise FakeNVMLError(init_error)

    def nvml_shutdown() -> None:
        calls.shutdown += 1

    def get_handle(index: int) -> FakeGpu:
        gpu = devices[index]
        check(gpu, "nvmlDeviceGetHandleByIndex")
        return gpu

    def answer(query: str, value: Any) -> Any:
        def call(gpu: FakeGpu, *args: Any) -> Any:
            check(gpu, query)
            return value(gpu)

        return call

    def processes(pairs: list[tuple[int, int | None]]) -> list[types.SimpleNamespace]:
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=memory) for pid, memory in pairs]

    module.nvmlInit = nvml_init
    module.nvmlShutdown = nvml_shutdown
    module.nvmlDeviceGetCount = lambda: len(devices)
    module.nvmlDeviceGetHandleByIndex = get_handle
    module.nvmlDeviceGetName = answer("nvmlDeviceGetName", lambda gpu: gpu.name)
    module.nvmlDeviceGetUUID = answer("nvmlDeviceGetUUID", lambda gpu: gpu.uuid)
    module.nvmlDeviceGetMemoryInfo = answer(
        "nvmlDeviceGetMemoryInfo",
        lambda gpu: types.SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used),
    )
    module.nvmlDeviceGetUtilizationRates = answer(
        "nvmlDeviceGetUtilizationRates", lambda gpu: types.SimpleNamespace(gpu=gpu.utilization, memory=0)
    )
    module.nvmlDeviceGetTemperature = answer("nvmlDeviceGetTemperature", lambda gpu: gpu.temperature)
    module.nvmlDeviceGetComputeRunningProcesses = answer(
        "nvmlDeviceGetComputeRunningProcesses", lambda gpu: processes(gpu.compute)
    )
    module.nvmlDeviceGetGraphicsRunningProcesses = answer(
        "nvmlDeviceGetGraphicsRunningProcesses", lambda gpu: processes(gpu.graphics)
    )
    return module
