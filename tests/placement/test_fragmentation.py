"""The fragmentation measure, the target workload and the memoising cache."""

from __future__ import annotations

import numpy as np
import pytest

from gpushare.model import (
    FULL_CORE_PERCENT,
    Allocation,
    Gpu,
    GpuShare,
    Ledger,
    Node,
    Request,
)
from gpushare.placement.engine import Placer
from gpushare.placement.frag_cache import FragmentationCache
from gpushare.placement.fragmentation import (
    DEFAULT_COVERAGE,
    Shape,
    TargetWorkload,
    WorkloadArrays,
    fragmentation,
)

GPU_MIB = 16000


def gpu_request(name: str, memory: int, count: int = 1, cpu: int = 0, **kw) -> Request:
    return Request(name, cpu_milli=cpu, gpu_count=count, memory_mib_per_gpu=memory, **kw)


def measure(
    workload: TargetWorkload,
    free_memory: list[int],
    *,
    cpu_free: int = 8000,
    free_core: list[int] | None = None,
    fully_free: list[bool] | None = None,
    memory: list[int] | None = None,
    model_ids: list[int] | None = None,
    usable: list[bool] | None = None,
    models: tuple[str, ...] = ("A100",),
) -> float:
    """Fragmentation of one node state given GPU by GPU."""
    k = len(free_memory)
    free_core = [FULL_CORE_PERCENT] * k if free_core is None else free_core
    memory = [GPU_MIB] * k if memory is None else memory
    fully_free = (
        [f == m for f, m in zip(free_memory, memory, strict=True)]
        if (fully_free is None)
        else fully_free
    )
    model_ids = [0] * k if model_ids is None else model_ids
    usable = [True] * k if usable is None else usable
    result = fragmentation(
        WorkloadArrays(workload, models),
        np.array([cpu_free], dtype=np.int64),
        np.array([free_memory], dtype=np.int64),
        np.array([free_core], dtype=np.int64),
        np.array([fully_free], dtype=bool),
        np.array(memory, dtype=np.int64),
        np.array(model_ids, dtype=np.int64),
        np.array(usable, dtype=bool),
    )
    assert result.shape == (1,)
    return float(result[0])


def single(request: Request) -> TargetWorkload:
    return TargetWorkload.from_requests([request])


HALF = single(gpu_request("h", 8000, cpu=1000))


# -- the measure on hand-computed examples ---------------------------------------------------


def test_fitting_shape_counts_only_gpus_too_small_for_it() -> None:
    # 4000 MiB free is stranded for an 8000 MiB task; 12000 MiB is not.
    assert measure(HALF, [4000, 12000]) == pytest.approx(0.25)
    # A GPU with exactly the per-GPU need free is usable.
    assert measure(HALF, [8000, 3000, 16000]) == pytest.approx(3000 / GPU_MIB)
    assert measure(HALF, [8000, 16000]) == pytest.approx(0.0)


def test_full_gpus_add_nothing() -> None:
    assert measure(HALF, [0, 0]) == pytest.approx(0.0)


def test_shape_that_does_not_fit_counts_all_free() -> None:
    two_gpus = single(gpu_request("t", 8000, count=2))
    # Only one GPU has 8000 MiB: the shape cannot run, so all free capacity is lost to it.
    assert measure(two_gpus, [4000, 12000]) == pytest.approx(1.0)
    assert measure(two_gpus, [8000, 12000, 2000]) == pytest.approx(2000 / GPU_MIB)


def test_shape_without_enough_cpu_counts_all_free() -> None:
    heavy = single(gpu_request("c", 4000, cpu=16000))
    assert measure(heavy, [4000, 12000], cpu_free=8000) == pytest.approx(1.0)
    assert measure(heavy, [4000, 12000], cpu_free=16000) == pytest.approx(0.0)


def test_cpu_only_shape_counts_all_free() -> None:
    cpu_only = single(Request("c", cpu_milli=1000))
    assert measure(cpu_only, [4000, 12000]) == pytest.approx(1.0)
    assert measure(cpu_only, [16000, 16000, 0]) == pytest.approx(2.0)


def test_core_limits_eligibility() -> None:
    workload = single(gpu_request("k", 4000, core_percent_per_gpu=50))
    # GPU 0 has memory but only 40% core: stranded; GPU 1 serves the shape.
    assert measure(workload, [10000, 8000], free_core=[40, 60]) == pytest.approx(10000 / GPU_MIB)


def test_exclusive_shape_needs_fully_free_gpu() -> None:
    exclusive = single(Request("x", gpu_count=1, exclusive=True))
    assert measure(exclusive, [16000, 12000]) == pytest.approx(0.75)
    # No whole GPU: nothing can run, all free capacity counts.
    assert measure(exclusive, [12000, 4000]) == pytest.approx(1.0)


def test_model_constraint() -> None:
    models = ("A10", "A100")
    a100 = single(gpu_request("m", 4000, allowed_models=frozenset({"A100"})))
    # GPU 0 (A10, 16000 free) cannot serve the shape; GPU 1 (A100) can.
    assert measure(a100, [16000, 8000], model_ids=[0, 1], models=models) == pytest.approx(1.0)
    # Only A10 GPUs: the shape does not fit, all free counts.
    assert measure(a100, [16000, 8000], model_ids=[0, 0], models=models) == pytest.approx(1.5)
    h100 = single(gpu_request("m", 4000, allowed_models=frozenset({"H100"})))
    assert measure(h100, [16000, 8000], model_ids=[1, 1], models=models) == pytest.approx(1.5)


def test_unhealthy_and_absent_gpus_count_nothing() -> None:
    # GPU 1 is unhealthy, slot 2 is padding for an absent GPU.
    value = measure(
        HALF,
        [4000, 16000, -1],
        memory=[GPU_MIB, GPU_MIB, 0],
        model_ids=[0, 0, -1],
        usable=[True, False, False],
        fully_free=[False, True, False],
    )
    # The shape cannot run (GPU 0 too small, GPU 1 unusable): all usable free counts.
    assert value == pytest.approx(0.25)


def test_amounts_are_in_gpus_of_each_size() -> None:
    workload = single(gpu_request("s", 6000))
    assert measure(workload, [4000, 4000], memory=[8000, 16000]) == pytest.approx(0.75)


def test_weights_combine_shapes() -> None:
    requests = [gpu_request(f"g{i}", 8000, cpu=1000) for i in range(3)]
    requests.append(Request("c", cpu_milli=1000))
    workload = TargetWorkload.from_requests(requests)
    assert workload.weights == (0.75, 0.25)
    # GPU shape: 0.25 stranded; CPU-only shape: all 1.0 free.
    assert measure(workload, [4000, 12000]) == pytest.approx(0.75 * 0.25 + 0.25 * 1.0)


def test_batch_of_states() -> None:
    arrays = WorkloadArrays(HALF, ("A100",))
    result = fragmentation(
        arrays,
        np.array([8000, 8000, 0], dtype=np.int64),
        np.array([[4000, 12000], [16000, 16000], [4000, 12000]], dtype=np.int64),
        np.full((3, 2), 100, dtype=np.int64),
        np.array([[False, False], [True, True], [False, False]]),
        np.array([GPU_MIB, GPU_MIB], dtype=np.int64),
        np.array([0, 0], dtype=np.int64),
        np.array([True, True]),
    )
    np.testing.assert_allclose(result, [0.25, 0.0, 1.0])


# -- the target workload ---------------------------------------------------------------------


def counted_requests() -> list[Request]:
    """Shapes A (5 requests), B (3), C (1) and D (1); C sorts before D."""
    a = [gpu_request(f"a{i}", 8000) for i in range(5)]
    b = [gpu_request(f"b{i}", 4000) for i in range(3)]
    c = [gpu_request("c", 2000, cpu=100)]
    d = [gpu_request("d", 2000, cpu=200)]
    return a + b + c + d


def shape(memory: int, cpu: int = 0) -> Shape:
    return Shape.of(gpu_request("x", memory, cpu=cpu))


@pytest.mark.parametrize(
    ("coverage", "shapes", "weights"),
    [
        (0.5, [shape(8000)], [1.0]),
        (0.51, [shape(8000), shape(4000)], [5 / 8, 3 / 8]),
        (0.8, [shape(8000), shape(4000)], [5 / 8, 3 / 8]),
        (0.85, [shape(8000), shape(4000), shape(2000, 100)], [5 / 9, 3 / 9, 1 / 9]),
        (
            DEFAULT_COVERAGE,
            [shape(8000), shape(4000), shape(2000, 100), shape(2000, 200)],
            [0.5, 0.3, 0.1, 0.1],
        ),
        (
            1.0,
            [shape(8000), shape(4000), shape(2000, 100), shape(2000, 200)],
            [0.5, 0.3, 0.1, 0.1],
        ),
    ],
)
def test_coverage_cut_off(coverage: float, shapes: list[Shape], weights: list[float]) -> None:
    requests = counted_requests()
    for ordering in (requests, requests[::-1]):
        workload = TargetWorkload.from_requests(ordering, coverage=coverage)
        assert list(workload.shapes) == shapes
        assert list(workload.weights) == pytest.approx(weights)
        assert sum(workload.weights) == pytest.approx(1.0)


def test_default_coverage_is_95_percent() -> None:
    # 19 of one shape and 1 of another: 95% reached by the first alone.
    requests = [gpu_request(f"a{i}", 8000) for i in range(19)] + [gpu_request("b", 4000)]
    assert TargetWorkload.from_requests(requests).shapes == (shape(8000),)
    requests.append(gpu_request("c", 4000))  # now 19/21 < 95%
    assert len(TargetWorkload.from_requests(requests).shapes) == 2


def test_empty_workload() -> None:
    workload = TargetWorkload.from_requests([])
    assert workload.shapes == ()
    assert workload.weights == ()


def test_shape_ignores_host_memory_and_exclusive_sizes() -> None:
    assert Shape.of(gpu_request("a", 8000)) == Shape.of(
        Request("b", memory_mib=4096, gpu_count=1, memory_mib_per_gpu=8000)
    )
    exclusive = Shape.of(Request("x", gpu_count=2, exclusive=True, memory_mib_per_gpu=500))
    assert (exclusive.memory_mib_per_gpu, exclusive.core_percent_per_gpu) == (0, 0)
    assert exclusive.exclusive
    workload = TargetWorkload.from_requests(
        [Request(f"r{i}", memory_mib=i, gpu_count=1, memory_mib_per_gpu=8000) for i in range(4)]
    )
    assert workload.weights == (1.0,)


# -- the cache -------------------------------------------------------------------------------


MIXED_WORKLOAD = TargetWorkload.from_requests(
    [gpu_request(f"h{i}", 8000, cpu=1000, core_percent_per_gpu=20) for i in range(4)]
    + [gpu_request(f"q{i}", 4000, cpu=500) for i in range(3)]
    + [gpu_request("two", 6000, count=2, cpu=2000)] * 2
    + [Request("x", cpu_milli=4000, gpu_count=1, exclusive=True)] * 2
    + [gpu_request("a10", 3000, allowed_models=frozenset({"A10"}))]
    + [Request("c", cpu_milli=1000)],
    coverage=1.0,
)


def make_node(name: str, models: tuple[str, ...], cpu: int = 16000) -> Node:
    gpus = tuple(
        Gpu(index=i, uuid=f"{name}-gpu{i}", model=m, memory_mib=GPU_MIB)
        for i, m in enumerate(models)
    )
    return Node(name, gpus, cpu_milli=cpu, memory_mib=65536)


def share(ledger: Ledger, node: int, slot: int, memory: int, core: int, exclusive: bool):
    gpu = ledger.nodes[node].gpus[slot]
    return GpuShare(gpu.uuid, gpu.index, memory, core, exclusive)


def allocate(ledger: Ledger, name: str, node: int, request: Request, slots: list[int]):
    shares = tuple(
        share(ledger, node, slot, GPU_MIB, FULL_CORE_PERCENT, True)
        if request.exclusive
        else share(
            ledger, node, slot, request.memory_mib_per_gpu, request.core_percent_per_gpu, False
        )
        for slot in slots
    )
    allocation = Allocation(name, ledger.nodes[node].name, request.cpu_milli, 0, shares)
    ledger.reserve(allocation)
    return allocation


def busy_ledger() -> Ledger:
    ledger = Ledger(
        [
            make_node("n0", ("A100",) * 4),
            make_node("n1", ("A10", "A10", "A100")),
            make_node("n2", ("A100", "A100"), cpu=4000),
            make_node("n3", ()),
            make_node("n4", ("A100",) * 4),
        ]
    )
    allocate(ledger, "p0", 0, gpu_request("p0", 10000, cpu=2000, core_percent_per_gpu=30), [0])
    allocate(ledger, "p1", 0, gpu_request("p1", 5000, core_percent_per_gpu=80), [1])
    allocate(ledger, "p2", 0, Request("p2", gpu_count=1, exclusive=True), [3])
    allocate(ledger, "p3", 1, gpu_request("p3", 13000), [1])
    allocate(ledger, "p4", 2, gpu_request("p4", 6000, cpu=3500), [0])
    ledger.set_gpu_health("n2", 1, False)
    ledger.reserve(Allocation("p5", "n3", 8000, 0))
    return ledger


def direct(ledger: Ledger, workload: TargetWorkload, node: int) -> float:
    usable = ledger.gpu_present[node] & ledger.gpu_healthy[node]
    rows = slice(node, node + 1)
    return float(
        fragmentation(
            WorkloadArrays(workload, ledger.models),
            ledger.cpu_free_milli[rows],
            ledger.gpu_free_memory_mib[rows],
            ledger.gpu_free_core_percent[rows],
            ledger.gpu_fully_free()[rows],
            ledger.gpu_memory_mib[node],
            ledger.gpu_model_id[node],
            usable,
        )[0]
    )


def test_node_fragmentation_equals_direct_measure() -> None:
    ledger = busy_ledger()
    cache = FragmentationCache(ledger, MIXED_WORKLOAD)
    values = []
    for node in range(len(ledger)):
        value = cache.node_fragmentation(node)
        assert value == pytest.approx(direct(ledger, MIXED_WORKLOAD, node), abs=1e-12)
        values.append(value)
    assert cache.cluster_fragmentation() == pytest.approx(sum(values))
    # n3 has no GPU to fragment; the others all have some capacity lost to some shape.
    assert values[3] == 0.0
    assert all(value > 0 for i, value in enumerate(values) if i != 3)


def test_empty_node_fragmentation_against_hand_value() -> None:
    ledger = Ledger([make_node("n0", ("A100", "A100"))])
    cache = FragmentationCache(ledger, HALF)
    assert cache.node_fragmentation(0) == 0.0
    allocate(ledger, "a", 0, gpu_request("a", 12000), [0])
    assert cache.node_fragmentation(0) == pytest.approx(4000 / GPU_MIB)


PROBES = [
    gpu_request("s1", 4000, cpu=500),
    gpu_request("s2", 8000, cpu=1000, core_percent_per_gpu=20),
    gpu_request("s3", 2500, count=2),
    gpu_request("s4", 3000, allowed_models=frozenset({"A10"})),
    Request("s5", cpu_milli=1000, gpu_count=1, exclusive=True),
    Request("s6", cpu_milli=2000),
]


@pytest.mark.parametrize("request_", PROBES, ids=lambda r: r.name)
def test_best_placement_matches_reserving_and_remeasuring(request_: Request) -> None:
    ledger = busy_ledger()
    cache = FragmentationCache(ledger, MIXED_WORKLOAD)
    placer = Placer(ledger, "binpack")
    fits, eligible = placer.feasible(request_)
    assert fits.any()
    for node in np.flatnonzero(fits).tolist():
        before = cache.node_fragmentation(node)
        increase = float(cache.increase(request_, np.array([node]))[0])
        frag, slots = cache.best_placement(node, request_)
        assert len(slots) == request_.gpu_count
        assert len(set(slots)) == len(slots)
        assert all(eligible[node, slot] for slot in slots)
        assert increase == pytest.approx(frag - before, abs=1e-12)
        allocate(ledger, "probe", node, request_, slots)
        assert direct(ledger, MIXED_WORKLOAD, node) == pytest.approx(frag, abs=1e-12)
        assert cache.node_fragmentation(node) == pytest.approx(frag, abs=1e-12)
        ledger.release("probe")
        assert cache.node_fragmentation(node) == pytest.approx(before, abs=1e-12)


@pytest.mark.parametrize("request_", [p for p in PROBES if p.gpu_count == 1], ids=lambda r: r.name)
def test_best_placement_is_optimal_for_one_gpu(request_: Request) -> None:
    ledger = busy_ledger()
    cache = FragmentationCache(ledger, MIXED_WORKLOAD)
    fits, eligible = Placer(ledger, "binpack").feasible(request_)
    for node in np.flatnonzero(fits).tolist():
        slots = np.flatnonzero(eligible[node]).tolist()
        outcomes = []
        for slot in slots:
            allocate(ledger, "probe", node, request_, [slot])
            outcomes.append(direct(ledger, MIXED_WORKLOAD, node))
            ledger.release("probe")
        frag, _ = cache.best_placement(node, request_)
        assert frag == pytest.approx(min(outcomes), abs=1e-12)


def test_cache_notices_reserve_release_and_health() -> None:
    ledger = busy_ledger()
    cache = FragmentationCache(ledger, MIXED_WORKLOAD)
    probe = gpu_request("s", 4000, cpu=500)
    nodes = np.array([0, 1, 2, 4])
    stale_increase = cache.increase(probe, nodes).copy()
    stale = [cache.node_fragmentation(n) for n in range(len(ledger))]

    allocate(ledger, "late", 4, gpu_request("late", 9000), [2])
    allocate(ledger, "late2", 1, gpu_request("late2", 9000), [0])
    ledger.set_gpu_health("n0", 2, False)

    fresh = FragmentationCache(ledger, MIXED_WORKLOAD)
    for node in range(len(ledger)):
        assert cache.node_fragmentation(node) == pytest.approx(direct(ledger, MIXED_WORKLOAD, node))
    assert cache.node_fragmentation(4) != pytest.approx(stale[4])
    assert cache.node_fragmentation(0) != pytest.approx(stale[0])
    assert cache.node_fragmentation(2) == stale[2]
    np.testing.assert_allclose(cache.increase(probe, nodes), fresh.increase(probe, nodes))
    assert not np.allclose(cache.increase(probe, nodes), stale_increase)

    ledger.release("late")
    assert cache.node_fragmentation(4) == pytest.approx(stale[4])


def test_cache_shares_results_between_nodes_in_equal_state() -> None:
    # Two idle identical nodes: equal fragmentation and equal growth, slot choices mapped to
    # each node's own slots.
    ledger = Ledger([make_node("a", ("A100",) * 3), make_node("b", ("A100",) * 3)])
    allocate(ledger, "pa", 0, gpu_request("pa", 12000), [2])
    allocate(ledger, "pb", 1, gpu_request("pb", 12000), [0])
    cache = FragmentationCache(ledger, HALF)
    assert cache.node_fragmentation(0) == cache.node_fragmentation(1)
    probe = gpu_request("s", 2000)
    frag_a, slots_a = cache.best_placement(0, probe)
    frag_b, slots_b = cache.best_placement(1, probe)
    assert frag_a == frag_b
    # Filling the 4000 MiB fragment is best; it sits in slot 2 on a and slot 0 on b.
    assert (slots_a, slots_b) == ([2], [0])
