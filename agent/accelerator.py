"""Which accelerator this node has, proven before the agent says anything to the control plane.

NVIDIA telemetry comes from NVML through nvidia-ml-py (``import pynvml``). ``read_gpus`` is the whole
NVML → inventory mapping, a pure function of the ``pynvml`` module it is handed, so tests replace NVML
at exactly that boundary.

Seeds (Troubleshooting, Nodes): configured for NVIDIA, the agent exits 3 before enrollment, heartbeat,
inventory or telemetry publication on ``NVIDIA_NVML_UNAVAILABLE``, ``NVIDIA_DEVICE_NOT_FOUND`` or
``NVIDIA_TELEMETRY_UNAVAILABLE``; in ``auto`` an inherited non-empty ``NVIDIA_VISIBLE_DEVICES`` is
affirmative GPU evidence.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

logger = logging.getLogger("agent.accelerator")

NVIDIA = "nvidia"
CPU = "cpu"

NVIDIA_NVML_UNAVAILABLE = "NVIDIA_NVML_UNAVAILABLE"
NVIDIA_DEVICE_NOT_FOUND = "NVIDIA_DEVICE_NOT_FOUND"
NVIDIA_TELEMETRY_UNAVAILABLE = "NVIDIA_TELEMETRY_UNAVAILABLE"

# NVIDIA_VISIBLE_DEVICES values the NVIDIA Container Toolkit reads as "no GPU".
NO_GPU_VISIBLE = frozenset({"void", "none"})

NVML_CHECKS = (
    "confirm the host driver works with `nvidia-smi`, the NVIDIA Container Toolkit is installed, the "
    "container receives /dev/nvidia*, and the runtime injects libnvidia-ml.so.1. Do not copy a driver "
    "library into the image: it must match the host kernel driver. Use "
    "MODELFORGE_AGENT_ACCELERATOR_MODE=cpu only for a genuinely CPU-only node"
)


class AcceleratorRefusal(Exception):
    """The accelerator the agent is configured for cannot be used; the agent exits 3."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


class GpuTelemetryError(Exception):
    """One listed GPU did not answer one telemetry query."""

    def __init__(self, index: int, query: str, error: BaseException) -> None:
        super().__init__(f"GPU {index}: {query} failed ({error})")
        self.index = index
        self.query = query
        self.error = error


@dataclass(frozen=True)
class GpuReading:
    """One GPU as NVML reports it, with its memory split into ModelForge's share and everyone else's."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    memory_managed_bytes: int
    utilization_percent: int
    temperature_c: int

    @property
    def external_pressure_bytes(self) -> int:
        """Memory held by processes the agent did not start (Ollama, Plex, ...): observed, never reclaimed."""
        return max(0, self.memory_used_bytes - self.memory_managed_bytes)

    def as_payload(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_managed_bytes": self.memory_managed_bytes,
            "utilization_percent": self.utilization_percent,
            "temperature_c": self.temperature_c,
        }


def _text(value: str | bytes) -> str:
    """NVML strings arrive as ``bytes`` from older nvidia-ml-py releases and ``str`` from newer ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def _managed_bytes(nvml: Any, handle: Any, managed_pids: Collection[int]) -> int:
    """The GPU memory held by processes the agent started.

    A GPU or driver that cannot list its processes (``NVMLError_NotSupported``, seen under some
    virtualisation) yields 0: everything in use then counts as external pressure, which never
    overstates headroom. ``usedGpuMemory`` is ``None`` where NVML cannot attribute memory per process.
    """
    if not managed_pids:
        return 0
    total = 0
    seen: set[int] = set()
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            processes = getattr(nvml, query)(handle)
        except nvml.NVMLError:
            continue
        for process in processes:
            # A process using both compute and graphics appears in both lists with the same memory.
            if process.pid in managed_pids and process.pid not in seen:
                seen.add(process.pid)
                total += int(process.usedGpuMemory or 0)
    return total


def read_gpus(nvml: Any, managed_pids: Collection[int] = ()) -> list[GpuReading]:
    """Every GPU NVML lists, mapped to the heartbeat's inventory. NVML must be initialised.

    Raises ``GpuTelemetryError`` when a listed GPU fails a query (handle, name, uuid, memory,
    utilisation, temperature): a reading the agent does not have is not one it can guess.
    """
    count = int(nvml.nvmlDeviceGetCount())
    readings: list[GpuReading] = []
    for index in range(count):
        query = "nvmlDeviceGetHandleByIndex"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            query = "nvmlDeviceGetName"
            name = _text(nvml.nvmlDeviceGetName(handle))
            query = "nvmlDeviceGetUUID"
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            query = "nvmlDeviceGetMemoryInfo"
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            query = "nvmlDeviceGetUtilizationRates"
            utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
            query = "nvmlDeviceGetTemperature"
            temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        except nvml.NVMLError as exc:
            raise GpuTelemetryError(index, query, exc) from exc
        readings.append(
            GpuReading(
                index=index,
                uuid=uuid,
                name=name,
                memory_total_bytes=int(memory.total),
                memory_used_bytes=int(memory.used),
                memory_managed_bytes=_managed_bytes(nvml, handle, managed_pids),
                utilization_percent=int(utilization.gpu),
                temperature_c=int(temperature),
            )
        )
    return readings


@dataclass
class Accelerator:
    """The accelerator the agent reports, with the initialised NVML module when it is NVIDIA."""

    kind: str
    nvml: Any = None
    reason: str = ""

    def gpus(self, managed_pids: Collection[int] = ()) -> list[GpuReading]:
        if self.kind != NVIDIA:
            return []
        return read_gpus(self.nvml, managed_pids)

    def shutdown(self) -> None:
        if self.nvml is not None:
            _shutdown_quietly(self.nvml)
            self.nvml = None


def _import_nvml() -> ModuleType:
    return importlib.import_module("pynvml")


def _nvml_unavailable(detail: str) -> AcceleratorRefusal:
    return AcceleratorRefusal(
        NVIDIA_NVML_UNAVAILABLE,
        f"the agent is configured for NVIDIA but cannot initialise NVML ({detail}); {NVML_CHECKS}",
    )


def _initialise_nvml() -> Any:
    """The initialised ``pynvml`` module, or ``NVIDIA_NVML_UNAVAILABLE``."""
    try:
        nvml: Any = _import_nvml()
    except ImportError as exc:
        raise _nvml_unavailable(f"nvidia-ml-py is not installed: {exc}") from exc
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError) as exc:
        raise _nvml_unavailable(f"nvmlInit failed: {exc}") from exc
    return nvml


def _prove_nvidia(nvml: Any) -> Accelerator:
    """NVML is up: there must be a device, and every listed device must answer every query."""
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        raise _nvml_unavailable(f"nvmlDeviceGetCount failed: {exc}") from exc
    if count == 0:
        raise AcceleratorRefusal(
            NVIDIA_DEVICE_NOT_FOUND,
            "NVML initialised but enumerated no GPU; check that the container is given the GPUs "
            "(NVIDIA_VISIBLE_DEVICES, `--gpus`, the Compose `deploy.resources.reservations.devices`) and "
            f"that `nvidia-smi` lists them on the host. {NVML_CHECKS}",
        )
    try:
        readings = read_gpus(nvml)
    except GpuTelemetryError as exc:
        raise AcceleratorRefusal(
            NVIDIA_TELEMETRY_UNAVAILABLE,
            f"GPU {exc.index} is listed but has no telemetry: {exc.query} failed ({exc.error}); check "
            f"`nvidia-smi -q -i {exc.index}` on the host and the kernel log for Xid errors. {NVML_CHECKS}",
        ) from exc
    names = ", ".join(f"{gpu.index}: {gpu.name}" for gpu in readings)
    return Accelerator(NVIDIA, nvml, f"{len(readings)} GPU(s) with telemetry ({names})")


def _shutdown_quietly(nvml: Any) -> None:
    # Leaving anyway (or a probe that failed): nothing to do about a failed shutdown.
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


def detect_accelerator(mode: str, environ: Mapping[str, str]) -> Accelerator:
    """The accelerator for ``mode`` (``auto`` | ``nvidia`` | ``cpu``), or ``AcceleratorRefusal``.

    1. ``cpu``: CPU, NVML untouched.
    2. ``nvidia``, or ``auto`` with a non-empty ``NVIDIA_VISIBLE_DEVICES`` other than void/none (GPU
       evidence): NVML must initialise, list at least one GPU and give telemetry for every one.
    3. ``auto`` without that evidence: try NVML quietly; no library, no driver or no device means CPU.
       NVML that lists GPUs is evidence too, and from then on the NVIDIA rules of step 2 apply.
    """
    if mode == CPU:
        return Accelerator(CPU, reason="MODELFORGE_AGENT_ACCELERATOR_MODE=cpu")
    visible = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    evidence = bool(visible) and visible.lower() not in NO_GPU_VISIBLE
    if mode == NVIDIA or evidence:
        nvml = _initialise_nvml()
        try:
            accelerator = _prove_nvidia(nvml)
        except AcceleratorRefusal:
            _shutdown_quietly(nvml)
            raise
        why = "MODELFORGE_AGENT_ACCELERATOR_MODE=nvidia" if mode == NVIDIA else "NVIDIA_VISIBLE_DEVICES"
        accelerator.reason = f"{why}: {accelerator.reason}"
        return accelerator
    # auto, no evidence inherited: a quiet look.
    try:
        nvml = _initialise_nvml()
    except AcceleratorRefusal as exc:
        logger.debug("auto accelerator: NVML not available (%s); using CPU", exc.message.split(";")[0])
        return Accelerator(CPU, reason="auto: no NVIDIA_VISIBLE_DEVICES and NVML not available")
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError:
        count = 0
    if count == 0:
        _shutdown_quietly(nvml)
        return Accelerator(CPU, reason="auto: no NVIDIA_VISIBLE_DEVICES and NVML lists no GPU")
    try:
        accelerator = _prove_nvidia(nvml)
    except AcceleratorRefusal:
        _shutdown_quietly(nvml)
        raise
    accelerator.reason = f"auto: NVML lists GPUs: {accelerator.reason}"
    return accelerator
