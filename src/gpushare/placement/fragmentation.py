"""GPU fragmentation of a node against a target workload (Weng et al., USENIX ATC'23).

A node's fragmentation is the free GPU capacity that the workload's typical task shapes could
not use there, weighted by how often each shape occurs. For one shape: all of the node's free
GPU capacity if the shape cannot run on the node at all (or needs no GPU); otherwise the free
capacity of each GPU that is too small for the shape's per-GPU need. Amounts are in GPUs (a
GPU's free memory over its total), so nodes of different GPU models add up.

This is the simulator's hot spot, so the measure is computed for a whole batch of candidate
states of one node with numpy, and memoised by node state in ``FragmentationCache``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpushare.model import Request

DEFAULT_COVERAGE = 0.95  # the paper's typical shapes cover 95% of tasks
DEFAULT_GPU_MEMORY_MIB = 16_000


@dataclass(frozen=True, slots=True)
class Shape:
    """A task shape as far as fragmentation is concerned (host memory does not count)."""

    cpu_milli: int
    gpu_count: int
    memory_mib_per_gpu: int
    core_percent_per_gpu: int
    exclusive: bool
    allowed_models: frozenset[str]

    @classmethod
    def of(cls, request: Request) -> Shape:
        return cls(
            cpu_milli=request.cpu_milli,
            gpu_count=request.gpu_count,
            memory_mib_per_gpu=0 if request.exclusive else request.memory_mib_per_gpu,
            core_percent_per_gpu=0 if request.exclusive else request.core_percent_per_gpu,
            exclusive=request.exclusive,
            allowed_models=request.allowed_models,
        )


@dataclass(frozen=True)
class TargetWorkload:
    """The typical shapes of a workload and the share of tasks each accounts for, and how much
    host CPU and memory its GPU tasks take per GPU."""

    shapes: tuple[Shape, ...]
    weights: tuple[float, ...]
    cpu_milli_per_gpu: float = 0.0
    host_memory_mib_per_gpu: float = 0.0

    @classmethod
    def from_requests(
        cls,
        requests: Iterable[Request],
        coverage: float = DEFAULT_COVERAGE,
        gpu_memory_mib: int = DEFAULT_GPU_MEMORY_MIB,
    ) -> TargetWorkload:
        """The most frequent shapes that together cover ``coverage`` of the requests.

        ``gpu_memory_mib`` is the memory of a typical GPU of the cluster: it turns a shared
        request's memory into a fraction of a GPU when computing the per-GPU host demand.
        """
        requests = list(requests)
        counts = Counter(Shape.of(request) for request in requests)
        typical = cls.from_shape_counts(counts, coverage)
        gpus = cpu_milli = host_memory_mib = 0.0
        for request in requests:
            if request.uses_gpu:
                per_gpu = 1.0 if request.exclusive else request.memory_mib_per_gpu / gpu_memory_mib
                gpus += request.gpu_count * per_gpu
                cpu_milli += request.cpu_milli
                host_memory_mib += request.memory_mib
        return cls(
            typical.shapes,
            typical.weights,
            cpu_milli_per_gpu=cpu_milli / gpus if gpus else 0.0,
            host_memory_mib_per_gpu=host_memory_mib / gpus if gpus else 0.0,
        )

    @classmethod
    def from_shape_counts(
        cls, counts: Mapping[Shape, int], coverage: float = DEFAULT_COVERAGE
    ) -> TargetWorkload:
        """The most frequent shapes that together cover ``coverage`` of the counted tasks; no
        host CPU or memory per GPU (for callers that leave those to someone else)."""
        total = sum(counts.values())
        shapes: list[Shape] = []
        weights: list[int] = []
        covered = 0
        # Ties in frequency are broken by the shape's fields so the result is deterministic.
        ordered = sorted(counts.items(), key=lambda item: (-item[1], _shape_sort_key(item[0])))
        for shape, count in ordered:
            if total and covered / total >= coverage:
                break
            if count <= 0:
                continue
            shapes.append(shape)
            weights.append(count)
            covered += count
        # Weights are shares of the typical tasks, as in the paper's simulator.
        return cls(tuple(shapes), tuple(w / covered for w in weights))


def _shape_sort_key(shape: Shape) -> tuple:
    return (
        shape.cpu_milli,
        shape.gpu_count,
        shape.memory_mib_per_gpu,
        shape.core_percent_per_gpu,
        shape.exclusive,
        tuple(sorted(shape.allowed_models)),
    )


class WorkloadArrays:
    """A target workload laid out as arrays over the GPU models of one cluster."""

    def __init__(self, workload: TargetWorkload, models: Sequence[str]) -> None:
        shapes = workload.shapes
        self.weight = np.array(workload.weights, dtype=np.float64)
        self.cpu_milli = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
        self.gpu_count = np.array([s.gpu_count for s in shapes], dtype=np.int64)
        self.memory_mib = np.array([s.memory_mib_per_gpu for s in shapes], dtype=np.int64)
        self.core_percent = np.array([s.core_percent_per_gpu for s in shapes], dtype=np.int64)
        self.exclusive = np.array([s.exclusive for s in shapes], dtype=bool)
        # allowed[j, m]: shape j may run on GPU model m; one extra column for "no GPU" slots.
        self.allowed = np.ones((len(shapes), len(models) + 1), dtype=bool)
        for j, shape in enumerate(shapes):
            if shape.allowed_models:
                self.allowed[j, :-1] = [model in shape.allowed_models for model in models]
            self.allowed[j, -1] = False
        self.needs_gpu = self.gpu_count > 0


def fragmentation(
    workload: WorkloadArrays,
    cpu_free_milli: np.ndarray,
    gpu_free_memory_mib: np.ndarray,
    gpu_free_core_percent: np.ndarray,
    gpu_fully_free: np.ndarray,
    gpu_memory_mib: np.ndarray,
    gpu_model_id: np.ndarray,
    gpu_usable: np.ndarray,
) -> np.ndarray:
    """Fragmentation, in GPUs, of C candidate states of one node.

    ``cpu_free_milli`` has shape (C,); the per-GPU free arrays (C, K) for the node's K GPU
    slots; ``gpu_memory_mib``, ``gpu_model_id`` (-1 for an absent slot) and ``gpu_usable``
    (present and healthy) have shape (K,).
    """
    free_fraction = np.where(gpu_usable, gpu_free_memory_mib / np.maximum(gpu_memory_mib, 1), 0.0)
    total = free_fraction.sum(axis=1)  # (C,)
    # eligible[c, j, k]: GPU k of state c can take one GPU's worth of shape j.
    fits_memory = gpu_free_memory_mib[:, None, :] >= workload.memory_mib[None, :, None]
    fits_core = gpu_free_core_percent[:, None, :] >= workload.core_percent[None, :, None]
    eligible = np.where(
        workload.exclusive[None, :, None], gpu_fully_free[:, None, :], fits_memory & fits_core
    )
    eligible &= workload.allowed[:, gpu_model_id][None, :, :] & gpu_usable[None, None, :]
    fits = (
        workload.needs_gpu[None, :]
        & (eligible.sum(axis=2) >= workload.gpu_count[None, :])
        & (cpu_free_milli[:, None] >= workload.cpu_milli[None, :])
    )
    stranded = (free_fraction[:, None, :] * ~eligible).sum(axis=2)  # (C, J)
    per_shape = np.where(fits, stranded, total[:, None])
    return per_shape @ workload.weight
