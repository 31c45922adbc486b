"""Domain types shared by every component: GPUs, nodes, requests and allocations.

Plain frozen dataclasses with no I/O. Validation happens at construction so that a bad
value is reported where it enters, with the field it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FULL_CORE_PERCENT = 100


class ModelError(ValueError):
    """A domain object was built from values that cannot be true."""


class CapacityError(ValueError):
    """An allocation would put more on a GPU or node than it has."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ModelError(message)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU of a node."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    numa_node: int = 0
    healthy: bool = True
    nvlink_peers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _require(self.index >= 0, f"GPU {self.uuid!r}: index must be >= 0, got {self.index}")
        _require(bool(self.uuid), f"GPU {self.index}: uuid must not be empty")
        _require(bool(self.model), f"GPU {self.index}: model must not be empty")
        _require(
            self.memory_mib > 0, f"GPU {self.index}: memory_mib must be > 0, got {self.memory_mib}"
        )


@dataclass(frozen=True, slots=True)
class Node:
    """A node's capacity: its GPUs and its host CPU and memory."""

    name: str
    gpus: tuple[Gpu, ...]
    cpu_milli: int
    memory_mib: int

    def __post_init__(self) -> None:
        _require(bool(self.name), "node name must not be empty")
        _require(self.cpu_milli >= 0, f"node {self.name}: cpu_milli must be >= 0")
        _require(self.memory_mib >= 0, f"node {self.name}: memory_mib must be >= 0")
        indices = [gpu.index for gpu in self.gpus]
        _require(
            len(set(indices)) == len(indices), f"node {self.name}: duplicate GPU index in {indices}"
        )

    @property
    def gpu_memory_mib(self) -> int:
        return sum(gpu.memory_mib for gpu in self.gpus)


@dataclass(frozen=True, slots=True)
class Request:
    """What one container needs.

    A shared request takes ``memory_mib_per_gpu`` and ``core_percent_per_gpu`` on each of
    ``gpu_count`` GPUs of one node; an exclusive request takes ``gpu_count`` whole GPUs; a
    request with ``gpu_count == 0`` needs only host CPU and memory.
    """

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    memory_mib_per_gpu: int = 0
    core_percent_per_gpu: int = 0
    exclusive: bool = False
    allowed_models: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        who = f"request {self.name!r}"
        _require(self.cpu_milli >= 0, f"{who}: cpu_milli must be >= 0, got {self.cpu_milli}")
        _require(self.memory_mib >= 0, f"{who}: memory_mib must be >= 0, got {self.memory_mib}")
        _require(self.gpu_count >= 0, f"{who}: gpu_count must be >= 0, got {self.gpu_count}")
        _require(
            0 <= self.core_percent_per_gpu <= FULL_CORE_PERCENT,
            f"{who}: core_percent_per_gpu must be 0..100, got {self.core_percent_per_gpu}",
        )
        if self.gpu_count == 0:
            _require(
                not self.exclusive and self.memory_mib_per_gpu == 0,
                f"{who}: GPU memory or exclusivity asked for with gpu_count 0",
            )
        elif not self.exclusive:
            _require(
                self.memory_mib_per_gpu > 0,
                f"{who}: a shared GPU request needs memory_mib_per_gpu > 0",
            )

    @property
    def uses_gpu(self) -> bool:
        return self.gpu_count > 0

    def allows(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


@dataclass(frozen=True, slots=True)
class GpuShare:
    """The part of one GPU given to a container."""

    uuid: str
    index: int
    memory_mib: int
    core_percent: int
    exclusive: bool = False


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where a request was placed: a node and, for GPU requests, a share of each chosen GPU."""

    request_name: str
    node_name: str
    cpu_milli: int
    memory_mib: int
    gpu_shares: tuple[GpuShare, ...] = ()

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(share.index for share in self.gpu_shares)
