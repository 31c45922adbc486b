"""Placement policies: how to rank feasible nodes, and which GPUs of the chosen node to use.

Every policy has a node half (``score_nodes``: higher is better, vectorised over the feasible
nodes) and a GPU half (``choose_gpus``); the engine may combine the node half of one policy
with the GPU half of another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpushare.model import Ledger, Request
from gpushare.placement.frag_cache import FragmentationCache


class PolicyError(ValueError):
    """A policy name or combination that cannot be used."""


@dataclass(slots=True)
class Context:
    ledger: Ledger
    fragmentation: FragmentationCache | None
    rng: np.random.Generator
    tie_rank: np.ndarray  # per node: its place in the order that breaks ties between scores


NodeScorer = Callable[[Context, Request, np.ndarray, np.ndarray], np.ndarray]
GpuChooser = Callable[[Context, Request, int, np.ndarray], list[int]]


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    score_nodes: NodeScorer
    choose_gpus: GpuChooser
    needs_workload: bool = False
    description: str = ""


# -- shared measures ---------------------------------------------------------------------------


def _free_gpus(ledger: Ledger, nodes: np.ndarray) -> np.ndarray:
    """Free GPU capacity of each node, in GPUs (free memory over total, summed)."""
    usable = ledger.gpu_present[nodes] & ledger.gpu_healthy[nodes]
    memory = np.maximum(ledger.gpu_memory_mib[nodes], 1)
    return np.where(usable, ledger.gpu_free_memory_mib[nodes] / memory, 0.0).sum(axis=1)


def _gpu_capacity(ledger: Ledger, nodes: np.ndarray) -> np.ndarray:
    return np.maximum((ledger.gpu_present[nodes] & ledger.gpu_healthy[nodes]).sum(axis=1), 1)


def _requested_gpus(ledger: Ledger, request: Request, nodes: np.ndarray) -> np.ndarray:
    """The request's GPU demand on each node, in GPUs of that node."""
    if request.exclusive or not request.uses_gpu:
        return np.full(len(nodes), float(request.gpu_count))
    memory = ledger.gpu_memory_mib[nodes].sum(axis=1) / np.maximum(ledger.gpu_count[nodes], 1)
    return request.gpu_count * request.memory_mib_per_gpu / np.maximum(memory, 1)


def _cpu_fraction_after(ledger: Ledger, request: Request, nodes: np.ndarray) -> np.ndarray:
    capacity = np.maximum(ledger.cpu_capacity_milli[nodes], 1)
    return (ledger.cpu_free_milli[nodes] - request.cpu_milli) / capacity


# -- node halves -------------------------------------------------------------------------------


def _score_binpack(ctx: Context, request: Request, nodes: np.ndarray, _e: np.ndarray):
    """Fullest node first: least free GPU left after placing, then least free CPU."""
    ledger = ctx.ledger
    free_after = _free_gpus(ledger, nodes) - _requested_gpus(ledger, request, nodes)
    return -free_after - 1e-3 * _cpu_fraction_after(ledger, request, nodes)


def _score_spread(ctx: Context, request: Request, nodes: np.ndarray, _e: np.ndarray):
    """Emptiest node first, by the share of its GPU capacity left free after placing."""
    ledger = ctx.ledger
    free_after = _free_gpus(ledger, nodes) - _requested_gpus(ledger, request, nodes)
    return free_after / _gpu_capacity(ledger, nodes)


def _cluster_max(ledger: Ledger) -> tuple[float, float]:
    """The largest node's CPU and GPU count: the paper's baselines normalise by these."""
    return float(max(ledger.cpu_capacity_milli.max(), 1)), float(max(ledger.gpu_count.max(), 1))


def _score_best_fit(ctx: Context, request: Request, nodes: np.ndarray, _e: np.ndarray):
    """Least remaining resources: CPU and GPU left after placing, each over the largest node's,
    averaged; integer scores rescaled to 0..100 as the paper's simulator does."""
    ledger = ctx.ledger
    max_cpu, max_gpus = _cluster_max(ledger)
    remaining = (
        0.5 * (ledger.cpu_free_milli[nodes] - request.cpu_milli) / max_cpu
        + 0.5 * (_free_gpus(ledger, nodes) - _requested_gpus(ledger, request, nodes)) / max_gpus
    )
    raw = np.trunc((1.0 - remaining) * 100)
    low, high = raw.min(), raw.max()
    if high == low:
        return np.zeros(len(nodes))
    return np.floor((raw - low) * 100 / (high - low))


def _score_dot_product(ctx: Context, request: Request, nodes: np.ndarray, _e: np.ndarray):
    """Tetris-style alignment: the smallest dot product of the request and the node's free
    CPU and GPU, each over the largest node's, scores highest."""
    ledger = ctx.ledger
    max_cpu, max_gpus = _cluster_max(ledger)
    dot = (ledger.cpu_free_milli[nodes] / max_cpu) * (request.cpu_milli / max_cpu) + (
        _free_gpus(ledger, nodes) / max_gpus
    ) * (_requested_gpus(ledger, request, nodes) / max_gpus)
    return np.trunc(100 * (1 - dot / 2))


def _score_gpu_packing(ctx: Context, request: Request, nodes: np.ndarray, eligible: np.ndarray):
    """A GPU already shared first (the fuller the better), then an idle GPU of a busy node,
    then an idle node (smaller nodes first), with the paper's simulator's score bands."""
    if not request.uses_gpu:
        return np.zeros(len(nodes))
    ledger = ctx.ledger
    in_use = ledger.gpu_sharers[nodes] > 0
    idle_node = ~in_use.any(axis=1)
    gpu_count = ledger.gpu_count[nodes]
    idle_score = np.maximum(33 - gpu_count, gpu_count)
    new_gpu_score = max(50 - request.gpu_count, 33)
    if request.exclusive:
        return np.where(idle_node, idle_score, new_gpu_score).astype(float)
    # A shared request goes to the tightest eligible GPU: is it already in use, and how much
    # is left on it afterwards?
    free = np.where(eligible[nodes], ledger.gpu_free_memory_mib[nodes], np.iinfo(np.int64).max)
    tightest = np.argmin(free, axis=1)
    rows = np.arange(len(nodes))
    tightest_in_use = in_use[rows, tightest]
    left_pct = (
        (free[rows, tightest] - request.memory_mib_per_gpu)
        * 100
        / np.maximum(ledger.gpu_memory_mib[nodes][rows, tightest], 1)
    )
    shared_score = np.maximum(100 - request.gpu_count * left_pct / 10, 50)
    score = np.where(tightest_in_use, shared_score, new_gpu_score)
    return np.trunc(np.where(idle_node, idle_score, score))


def _score_random(ctx: Context, _request: Request, nodes: np.ndarray, _e: np.ndarray):
    return ctx.rng.random(len(nodes))


def _score_fgd(ctx: Context, request: Request, nodes: np.ndarray, _e: np.ndarray):
    """Least growth of fragmentation against the target workload (Weng et al., ATC'23)."""
    assert ctx.fragmentation is not None
    increase = ctx.fragmentation.increase(request, nodes)
    # The paper's scheduler plugin scores sigmoid(-growth in GPUs) on kube-scheduler's integer
    # 0..100 scale; nodes within one step of each other tie and the tie order decides.
    return np.trunc(100 / (1 + np.exp(increase)))


# Our policy's knobs, tuned on the Alibaba 2023 trace (docs/placement.md shows the sweep).
STRANDING_WEIGHT = 0.3  # GPUs of fragmentation one stranded GPU is worth
HOST_HEADROOM = 1.1  # a node keeps this multiple of the workload's CPU and memory per GPU
PACKING_ORDER_WEIGHT = 1.0  # GPUs of fragmentation between the first and last node in order


def _stranded_gpus(
    free_gpus: np.ndarray,
    cpu_free_milli: np.ndarray,
    memory_free_mib: np.ndarray,
    cpu_milli_per_gpu: float,
    memory_mib_per_gpu: float,
) -> np.ndarray:
    """Free GPUs that the node's free CPU or host memory cannot feed at the workload's usual
    host demand per GPU."""
    stranded = np.zeros_like(free_gpus)
    if cpu_milli_per_gpu > 0:
        stranded = np.maximum(stranded, free_gpus - cpu_free_milli / cpu_milli_per_gpu)
    if memory_mib_per_gpu > 0:
        stranded = np.maximum(stranded, free_gpus - memory_free_mib / memory_mib_per_gpu)
    return stranded


def _score_fgd_pack(ctx: Context, request: Request, nodes: np.ndarray, _e: np.ndarray):
    """FGD's fragmentation growth, exact rather than on a 0..100 scale, plus two terms.

    Stranded GPUs: capacity that will sit idle because its node ran out of CPU or host
    memory. On the Alibaba trace most of FGD's failures near full load are of this kind:
    CPU-only and CPU-heavy tasks land on CPU-poor nodes (the fragmentation measure is flat for
    them), so GPUs stay free where no task can get the CPU to use them.

    A packing order: a fixed, seeded order of the nodes, earlier preferred. FGD's published
    results owe much to its coarse integer scores, whose many ties kube-scheduler breaks by a
    fixed node order; this term makes that packing explicit. A random order (rather than one
    by size or model) packs into a sample of every node type, so whole nodes of every type stay
    free for multi-GPU and model-constrained tasks.
    """
    assert ctx.fragmentation is not None
    ledger = ctx.ledger
    workload = ctx.fragmentation.target
    cpu_per_gpu = HOST_HEADROOM * workload.cpu_milli_per_gpu
    memory_per_gpu = HOST_HEADROOM * workload.host_memory_mib_per_gpu
    free_before = _free_gpus(ledger, nodes)
    free_after = free_before - _requested_gpus(ledger, request, nodes)
    cpu_free = ledger.cpu_free_milli[nodes]
    memory_free = ledger.memory_free_mib[nodes]
    stranded_before = _stranded_gpus(
        free_before, cpu_free, memory_free, cpu_per_gpu, memory_per_gpu
    )
    stranded_after = _stranded_gpus(
        free_after,
        cpu_free - request.cpu_milli,
        memory_free - request.memory_mib,
        cpu_per_gpu,
        memory_per_gpu,
    )
    growth = ctx.fragmentation.increase(request, nodes)
    order = ctx.tie_rank[nodes] / max(len(ledger) - 1, 1)
    return -(
        growth
        + STRANDING_WEIGHT * (stranded_after - stranded_before)
        + PACKING_ORDER_WEIGHT * order
    )


# -- GPU halves --------------------------------------------------------------------------------


def _eligible_slots(request: Request, eligible_row: np.ndarray) -> np.ndarray:
    slots = np.flatnonzero(eligible_row)
    if len(slots) < request.gpu_count:
        raise PolicyError(f"{request.name!r}: node has {len(slots)} eligible GPUs")
    return slots


def _choose_by_free(
    ctx: Context, request: Request, node: int, eligible_row: np.ndarray, most_free: bool
) -> list[int]:
    """The eligible GPUs with the least (or most) free memory, then core, then lowest slot."""
    if not request.uses_gpu:
        return []
    slots = _eligible_slots(request, eligible_row)
    sign = -1 if most_free else 1
    ledger = ctx.ledger
    order = np.lexsort(
        (
            slots,
            sign * ledger.gpu_free_core_percent[node, slots],
            sign * ledger.gpu_free_memory_mib[node, slots],
        )
    )
    return slots[order[: request.gpu_count]].tolist()


def _choose_tightest(ctx: Context, request: Request, node: int, eligible_row: np.ndarray):
    """The GPUs with the least free memory that still fit (then least free core)."""
    return _choose_by_free(ctx, request, node, eligible_row, most_free=False)


def _choose_emptiest(ctx: Context, request: Request, node: int, eligible_row: np.ndarray):
    return _choose_by_free(ctx, request, node, eligible_row, most_free=True)


def _choose_shared_first(ctx: Context, request: Request, node: int, eligible_row: np.ndarray):
    """GPUs that already hold shares first, tightest first."""
    if not request.uses_gpu:
        return []
    slots = _eligible_slots(request, eligible_row)
    ledger = ctx.ledger
    idle = ledger.gpu_sharers[node, slots] == 0
    order = np.lexsort((slots, ledger.gpu_free_memory_mib[node, slots], idle))
    return slots[order[: request.gpu_count]].tolist()


def _choose_random(ctx: Context, request: Request, node: int, eligible_row: np.ndarray):
    if not request.uses_gpu:
        return []
    slots = _eligible_slots(request, eligible_row)
    return sorted(ctx.rng.choice(slots, size=request.gpu_count, replace=False).tolist())


def _choose_fgd(ctx: Context, request: Request, node: int, eligible_row: np.ndarray):
    if not request.uses_gpu:
        return []
    assert ctx.fragmentation is not None
    return ctx.fragmentation.best_placement(node, request)[1]


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        Policy(
            "binpack",
            _score_binpack,
            _choose_tightest,
            description="fill a node and a GPU before using another",
        ),
        Policy(
            "spread",
            _score_spread,
            _choose_emptiest,
            description="emptiest node and GPU, to limit the blast radius of a GPU failure",
        ),
        Policy(
            "best-fit",
            _score_best_fit,
            _choose_tightest,
            description="node with the least CPU and GPU left after placing",
        ),
        Policy(
            "dot-product",
            _score_dot_product,
            _choose_tightest,
            description="smallest dot product of request and free resources",
        ),
        Policy(
            "gpu-packing",
            _score_gpu_packing,
            _choose_shared_first,
            description="shared GPU, then idle GPU of a busy node, then idle node",
        ),
        Policy("random", _score_random, _choose_random, description="uniformly random"),
        Policy(
            "fgd",
            _score_fgd,
            _choose_fgd,
            needs_workload=True,
            description="fragmentation gradient descent (Weng et al., ATC'23)",
        ),
        Policy(
            "fgd-pack",
            _score_fgd_pack,
            _choose_fgd,
            needs_workload=True,
            description="FGD plus host-resource stranding and a packing order (ours, default)",
        ),
    )
}

DEFAULT_POLICY = "fgd-pack"
