"""The node's GPUs as NVML reports them: UUID, index, model, memory, NUMA node, NVLink peers.

Runs the real NVML binding (nvidia-ml-py, ``import pynvml``); the tests point it at the
project's mock libnvidia-ml.so.1. A GPU's NVLink peers are found by matching the remote PCI
address of each active link with the other GPUs' addresses.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import pynvml

from gpushare import protocol

MIB = 1024 * 1024
_MODEL_PREFIXES = ("NVIDIA ", "Tesla ")


class DiscoveryError(RuntimeError):
    """NVML cannot be used or gave an answer gpushare cannot use; one line, says which."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of the node."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    numa: int
    pci_bus_id: str
    nvlink_peers: tuple[int, ...] = ()  # indices of GPUs joined to this one by NVLink

    def info(self, healthy: bool) -> protocol.GpuInfo:
        """The GPU as the node annotation gpushare.io/gpus describes it."""
        return protocol.GpuInfo(
            self.uuid, self.index, self.model, self.memory_mib, max(self.numa, 0), healthy
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def model_name(name: str) -> str:
    """NVML's device name as the model gpushare uses ("NVIDIA H200" -> "H200")."""
    for prefix in _MODEL_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return protocol.label_value(name.replace(" ", "-")) or "unknown"


def _numa(handle: Any) -> int:
    try:
        return int(pynvml.nvmlDeviceGetNumaNodeId(handle))
    except pynvml.NVMLError_NotSupported:
        return -1  # no NUMA affinity (a single-socket machine)


def _nvlink_bus_ids(handle: Any) -> list[str]:
    """The PCI bus IDs at the far end of each active NVLink of the GPU."""
    peers: list[str] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError_NotSupported:
            break  # no NVLink on this GPU
        except pynvml.NVMLError_InvalidArgument:
            break  # past the GPU's last link
        if active:
            peers.append(_text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
    return peers


def discover() -> tuple[str, list[Gpu]]:
    """The driver version and the GPUs, in index order; NVML must be initialised."""
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        found: list[tuple[Gpu, list[str]]] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu = Gpu(
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                index=index,
                model=model_name(_text(pynvml.nvmlDeviceGetName(handle))),
                memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                numa=_numa(handle),
                pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId).upper(),
            )
            found.append((gpu, _nvlink_bus_ids(handle)))
    except pynvml.NVMLError as error:
        raise DiscoveryError(f"NVML: GPU discovery failed: {error}") from None
    by_bus = {gpu.pci_bus_id: gpu.index for gpu, _ in found}
    gpus = []
    for gpu, bus_ids in found:
        peers = sorted({by_bus[bus.upper()] for bus in bus_ids if bus.upper() in by_bus})
        gpus.append(
            Gpu(
                gpu.uuid,
                gpu.index,
                gpu.model,
                gpu.memory_mib,
                gpu.numa,
                gpu.pci_bus_id,
                tuple(peers),
            )
        )
    return driver, gpus


def init_nvml() -> None:
    """nvmlInit, or DiscoveryError naming why NVML cannot be used."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise DiscoveryError(f"NVML: cannot initialise libnvidia-ml.so.1: {error}") from None


def shutdown_nvml() -> None:
    with contextlib.suppress(pynvml.NVMLError):  # already shut down: nothing to release
        pynvml.nvmlShutdown()
