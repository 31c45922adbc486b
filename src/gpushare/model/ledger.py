"""The cluster's allocation ledger: what every node and GPU has free, as numpy arrays.

The ledger is the one place that enforces the invariants (never more memory or core on a GPU
than it has, never more CPU or host memory on a node than it has, an exclusively held GPU
holds nothing else). Placement reads the arrays to filter and score all nodes at once; the
simulator and the extender both commit through ``reserve`` and ``release``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpushare.model.types import (
    FULL_CORE_PERCENT,
    Allocation,
    CapacityError,
    GpuShare,
    ModelError,
    Node,
)

NO_GPU = -1  # padding in the per-GPU arrays of nodes with fewer GPUs than the widest node


@dataclass(frozen=True, slots=True)
class _Held:
    node_index: int
    allocation: Allocation


class Ledger:
    """Free capacity of a fixed set of nodes, with the allocations that use it."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        names = [node.name for node in nodes]
        if len(set(names)) != len(names):
            duplicates = sorted({name for name in names if names.count(name) > 1})
            raise ModelError(f"duplicate node names: {', '.join(duplicates[:5])}")
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.node_index: dict[str, int] = {name: i for i, name in enumerate(names)}
        self.models: tuple[str, ...] = tuple(
            sorted({gpu.model for node in nodes for gpu in node.gpus})
        )
        model_id = {model: i for i, model in enumerate(self.models)}
        node_count = len(nodes)
        width = max((len(node.gpus) for node in nodes), default=0)
        self.gpu_width = width

        self.cpu_capacity_milli = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.memory_capacity_mib = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.cpu_free_milli = self.cpu_capacity_milli.copy()
        self.memory_free_mib = self.memory_capacity_mib.copy()

        self.gpu_count = np.array([len(n.gpus) for n in nodes], dtype=np.int64)
        self.gpu_present = np.zeros((node_count, width), dtype=bool)
        self.gpu_memory_mib = np.zeros((node_count, width), dtype=np.int64)
        self.gpu_model_id = np.full((node_count, width), NO_GPU, dtype=np.int64)
        self.gpu_healthy = np.zeros((node_count, width), dtype=bool)
        # Slot j of a node's arrays is its j-th GPU in the order given; gpu_index maps back.
        self.gpu_index = np.full((node_count, width), NO_GPU, dtype=np.int64)
        for i, node in enumerate(nodes):
            for slot, gpu in enumerate(node.gpus):
                self.gpu_present[i, slot] = True
                self.gpu_memory_mib[i, slot] = gpu.memory_mib
                self.gpu_model_id[i, slot] = model_id[gpu.model]
                self.gpu_healthy[i, slot] = gpu.healthy
                self.gpu_index[i, slot] = gpu.index
        # Absent GPUs have free memory -1 so that no request (which asks >= 0) fits them.
        self.gpu_free_memory_mib = np.where(self.gpu_present, self.gpu_memory_mib, NO_GPU)
        self.gpu_free_core_percent = np.where(self.gpu_present, FULL_CORE_PERCENT, NO_GPU)
        self.gpu_sharers = np.zeros((node_count, width), dtype=np.int64)
        self.gpu_exclusive = np.zeros((node_count, width), dtype=bool)
        # Bumped on every change of a node, so that caches keyed by node can tell they are stale.
        self.node_version = np.zeros(node_count, dtype=np.int64)
        self._held: dict[str, _Held] = {}

    # -- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.nodes)

    def holds(self, request_name: str) -> bool:
        return request_name in self._held

    def allocation(self, request_name: str) -> Allocation:
        return self._held[request_name].allocation

    def allocations(self) -> list[Allocation]:
        return [held.allocation for held in self._held.values()]

    def node_allocations(self, node_name: str) -> list[Allocation]:
        """The allocations a node holds now, in the order they were made."""
        i = self.node_index[node_name]
        return [held.allocation for held in self._held.values() if held.node_index == i]

    def slot_of(self, node_index: int, gpu_index: int) -> int:
        slots = np.nonzero(self.gpu_index[node_index] == gpu_index)[0]
        if len(slots) == 0:
            node = self.nodes[node_index].name
            raise CapacityError(f"node {node} has no GPU with index {gpu_index}")
        return int(slots[0])

    def gpu_fully_free(self) -> np.ndarray:
        """Per GPU: present, healthy and holding nothing (what an exclusive request needs)."""
        return self.gpu_present & self.gpu_healthy & (self.gpu_sharers == 0)

    # -- changes ---------------------------------------------------------------------------

    def set_gpu_health(self, node_name: str, gpu_index: int, healthy: bool) -> None:
        i = self.node_index[node_name]
        self.gpu_healthy[i, self.slot_of(i, gpu_index)] = healthy
        self.node_version[i] += 1

    def reserve(self, allocation: Allocation) -> None:
        """Commit an allocation, or raise CapacityError naming what it would overfill."""
        if allocation.request_name in self._held:
            raise CapacityError(f"{allocation.request_name!r} is already allocated")
        if allocation.node_name not in self.node_index:
            raise CapacityError(f"{allocation.request_name!r}: unknown node {allocation.node_name}")
        i = self.node_index[allocation.node_name]
        node = self.nodes[i]
        cpu_over = allocation.cpu_milli - int(self.cpu_free_milli[i])
        if cpu_over > 0:
            raise CapacityError(f"node {node.name}: CPU over by {cpu_over} milli")
        memory_over = allocation.memory_mib - int(self.memory_free_mib[i])
        if memory_over > 0:
            raise CapacityError(f"node {node.name}: host memory over by {memory_over} MiB")
        slots = [self.slot_of(i, share.index) for share in allocation.gpu_shares]
        if len(set(slots)) != len(slots):
            raise CapacityError(f"{allocation.request_name!r}: a GPU is named twice")
        for slot, share in zip(slots, allocation.gpu_shares, strict=True):
            self._check_share(i, slot, share)
        self.cpu_free_milli[i] -= allocation.cpu_milli
        self.memory_free_mib[i] -= allocation.memory_mib
        for slot, share in zip(slots, allocation.gpu_shares, strict=True):
            self.gpu_free_memory_mib[i, slot] -= share.memory_mib
            self.gpu_free_core_percent[i, slot] -= share.core_percent
            self.gpu_sharers[i, slot] += 1
            self.gpu_exclusive[i, slot] = share.exclusive
        self.node_version[i] += 1
        self._held[allocation.request_name] = _Held(i, allocation)

    def release(self, request_name: str) -> Allocation:
        """Give back what an allocation holds; unknown names raise KeyError."""
        held = self._held.pop(request_name)
        i, allocation = held.node_index, held.allocation
        self.cpu_free_milli[i] += allocation.cpu_milli
        self.memory_free_mib[i] += allocation.memory_mib
        for share in allocation.gpu_shares:
            slot = self.slot_of(i, share.index)
            self.gpu_free_memory_mib[i, slot] += share.memory_mib
            self.gpu_free_core_percent[i, slot] += share.core_percent
            self.gpu_sharers[i, slot] -= 1
            if share.exclusive:
                self.gpu_exclusive[i, slot] = False
        self.node_version[i] += 1
        return allocation

    def _check_share(self, i: int, slot: int, share: GpuShare) -> None:
        node = self.nodes[i]
        where = f"node {node.name} GPU {share.index}"
        if share.uuid != node.gpus[slot].uuid:
            raise CapacityError(f"{where}: uuid {share.uuid} is not {node.gpus[slot].uuid}")
        if self.gpu_exclusive[i, slot]:
            raise CapacityError(f"{where}: held exclusively, cannot take another share")
        if share.exclusive and (
            share.memory_mib != node.gpus[slot].memory_mib
            or share.core_percent != FULL_CORE_PERCENT
        ):
            raise CapacityError(
                f"{where}: an exclusive share must hold the whole GPU "
                f"({node.gpus[slot].memory_mib} MiB, {FULL_CORE_PERCENT}%)"
            )
        if share.exclusive and self.gpu_sharers[i, slot] > 0:
            raise CapacityError(
                f"{where}: exclusive use asked but {self.gpu_sharers[i, slot]} share(s) hold it"
            )
        memory_over = share.memory_mib - int(self.gpu_free_memory_mib[i, slot])
        if memory_over > 0:
            raise CapacityError(f"{where}: memory over by {memory_over} MiB")
        core_over = share.core_percent - int(self.gpu_free_core_percent[i, slot])
        if core_over > 0:
            raise CapacityError(f"{where}: core over by {core_over} percent")
