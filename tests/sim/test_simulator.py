"""Trace replay: arrival order, one seed's run on clusters small enough to work out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.model import Gpu, Node
from gpushare.placement.fragmentation import TargetWorkload
from gpushare.placement.policies import DEFAULT_POLICY, POLICIES
from gpushare.sim.simulator import SeedResult, arrival_order, gpu_capacity, run_seed
from gpushare.sim.trace import MILLI_PER_GPU, SIM_GPU_MEMORY_MIB, TracePod, trace_request


def node(name: str, gpus: int, model: str = "T4", cpu_milli: int = 32000) -> Node:
    return Node(
        name=name,
        gpus=tuple(
            Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=SIM_GPU_MEMORY_MIB)
            for i in range(gpus)
        ),
        cpu_milli=cpu_milli,
        memory_mib=65536,
    )


def pod(name: str, gpu_milli: int, gpu_count: int = 1, cpu_milli: int = 1000) -> TracePod:
    """A pod as load_pods makes it from a row of the trace."""
    request = trace_request(name, cpu_milli, 1024, gpu_count, gpu_milli)
    return TracePod(request, gpu_count * gpu_milli)


def workload(pods: list[TracePod]) -> TargetWorkload:
    return TargetWorkload.from_requests(p.request for p in pods)


def run(nodes, pods, policy=DEFAULT_POLICY, seed=42, inflate=1.3) -> SeedResult:
    return run_seed(nodes, pods, policy, seed, inflate, workload(pods))


# -- arrival order -------------------------------------------------------------------------------


def test_gpu_capacity_counts_gpus() -> None:
    assert gpu_capacity([node("a", 2), node("b", 0), node("c", 8)]) == 10
    assert gpu_capacity([]) == 0


def test_arrival_order_is_deterministic_per_seed() -> None:
    pods = [pod(f"p{i}", 100 * (i % 10 + 1)) for i in range(30)]
    first = arrival_order(pods, 7, 1.3, 20)
    assert arrival_order(pods, 7, 1.3, 20) == first
    assert arrival_order(pods, 8, 1.3, 20) != first


def test_arrival_order_without_draws_is_a_permutation() -> None:
    pods = [pod(f"p{i}", 1000) for i in range(12)]  # 12 GPUs requested
    order = arrival_order(pods, 3, 1.0, 10)  # the list already reaches the target
    assert sorted(order) == list(range(12))
    assert order != list(range(12))  # shuffled (12! orders; this seed's is not the identity)


def test_arrival_order_draws_until_the_target_is_reached() -> None:
    # 4 pods of half a GPU on 2 GPUs at 130%: 2.0 requested, then draws of 0.5 until >= 2.6.
    pods = [pod(f"p{i}", 500) for i in range(4)]
    order = arrival_order(pods, 1, 1.3, 2)
    assert sorted(order[:4]) == [0, 1, 2, 3]
    assert len(order) == 6  # 2.5 < 2.6 <= 3.0


@pytest.mark.parametrize(
    ("gpu_milli", "count", "capacity"),
    [(500, 4, 2), (250, 8, 2), (100, 10, 1)],
    ids=["halves", "quarters", "tenths"],
)
def test_arrival_order_stops_when_the_list_requests_exactly_the_target(
    gpu_milli: int, count: int, capacity: int
) -> None:
    # count * gpu_milli is exactly the capacity, the target at 100%: no draw is needed. With
    # tenths, adding 0.1 ten times in floating point gives 0.9999999999999999, and an extra pod
    # gets drawn although the pods request exactly one GPU.
    pods = [pod(f"p{i}", gpu_milli) for i in range(count)]
    order = arrival_order(pods, 5, 1.0, capacity)
    assert sorted(order) == list(range(count))


@settings(max_examples=60, deadline=None)
@given(
    # Multiples of 1/8 GPU and of 1/4 for inflate keep every sum exact in binary floating
    # point, so the property below is exact.
    milli=st.lists(st.sampled_from([0, 125, 250, 500, 750, 1000]), min_size=1, max_size=12),
    counts=st.data(),
    capacity=st.integers(min_value=1, max_value=16),
    inflate=st.sampled_from([0.5, 1.0, 1.25, 1.5, 2.0]),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_arrival_order_properties(milli, counts, capacity, inflate, seed) -> None:
    if not any(milli):
        milli = [*milli[:-1], 125]  # some pod must ask for a GPU, or the target is never met
    gpu_counts = [counts.draw(st.integers(1, 4)) if m else 0 for m in milli]
    pods = [pod(f"p{i}", m, c) for i, (m, c) in enumerate(zip(milli, gpu_counts, strict=True))]
    order = arrival_order(pods, seed, inflate, capacity)

    n = len(pods)
    assert sorted(order[:n]) == list(range(n))  # starts with a permutation of all pods
    assert all(0 <= i < n for i in order)
    assert order == arrival_order(pods, seed, inflate, capacity)
    target = round(inflate * capacity * MILLI_PER_GPU)
    requested = [pods[i].requested_gpu_milli for i in order]
    assert sum(requested) >= target
    if len(order) > n:  # a draw was needed, and the last one was the first to reach the target
        assert sum(requested[:-1]) < target


# -- one seed, worked out by hand ----------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_half_gpu_pods_fill_two_gpus_exactly(policy: str) -> None:
    # 1 node, 2 GPUs; 4 pods of 500 milli = 2 GPUs; at 130% two more are drawn (2.5, 3.0).
    # Any policy fits the first four (some GPU has half free until both are full).
    pods = [pod(f"p{i}", 500) for i in range(4)]
    result = run([node("n", 2)], pods, policy=policy, seed=1)

    np.testing.assert_allclose(result.arrived_pct, [25, 50, 75, 100, 125, 150])
    np.testing.assert_allclose(result.allocated_pct, [25, 50, 75, 100, 100, 100])
    assert result.failed_pods == 2
    assert result.failed_pods_at_100 == 0
    assert result.frag_rate_pct_at_100 == 0.0  # nothing left unallocated
    assert result.seed == 1
    assert result.wall_s >= 0
    assert result.allocated_at(100) == 100.0
    assert result.allocated_at(90) == 100.0
    assert result.allocated_at(50) == 50.0
    assert result.allocated_at(130) == 100.0


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_sixty_percent_pods_strand_the_rest_of_each_gpu(policy: str) -> None:
    # 1 node, 2 GPUs; pods of 600 milli: one per GPU, then 0.4 free on each, which no pod of
    # the workload (all 600 milli) can use: fragmentation rate 100% of the unallocated 0.8.
    # Arrival: 0.6, 1.2, 1.8 (the list), then 2.4, 3.0 (drawn until >= 2.6).
    pods = [pod(f"p{i}", 600) for i in range(3)]
    result = run([node("n", 2)], pods, policy=policy, seed=7)

    np.testing.assert_allclose(result.arrived_pct, [30, 60, 90, 120, 150])
    np.testing.assert_allclose(result.allocated_pct, [30, 60, 60, 60, 60])
    assert result.failed_pods == 3
    assert result.failed_pods_at_100 == 1  # only the third arrived before 100%
    assert result.frag_rate_pct_at_100 == pytest.approx(100.0)
    assert result.allocated_at(100) == 60.0


def test_whole_gpu_pods_take_one_node_each() -> None:
    # 2 nodes with 1 GPU and 1000m CPU each; two whole-GPU pods of 1000m: one per node.
    nodes = [node("a", 1, cpu_milli=1000), node("b", 1, cpu_milli=1000)]
    pods = [pod("g1", 1000), pod("g2", 1000)]
    result = run(nodes, pods, inflate=1.0)
    np.testing.assert_allclose(result.arrived_pct, [50, 100])
    np.testing.assert_allclose(result.allocated_pct, [50, 100])
    assert result.failed_pods == 0


def test_pod_needing_more_cpu_than_left_fails_and_is_counted() -> None:
    nodes = [node("a", 2, cpu_milli=1500)]
    pods = [pod("p1", 500, cpu_milli=1000), pod("p2", 500, cpu_milli=1000)]
    result = run(nodes, pods, inflate=0.5)  # the list (1 GPU) already reaches 50% of 2 GPUs
    np.testing.assert_allclose(result.arrived_pct, [25, 50])
    np.testing.assert_allclose(result.allocated_pct, [25, 25])
    assert result.failed_pods == 1
    assert result.failed_pods_at_100 == 1


def test_allocation_never_exceeds_arrival_or_capacity() -> None:
    nodes = [node("a", 2), node("b", 4, model="V100"), node("c", 1)]
    pods = [pod(f"p{i}", m, c) for i, (m, c) in enumerate([(300, 1), (1000, 2), (700, 1)] * 4)]
    result = run(nodes, pods, policy="random", seed=3)
    assert np.all(np.diff(result.arrived_pct) >= 0)
    assert np.all(np.diff(result.allocated_pct) >= 0)
    assert np.all(result.allocated_pct <= result.arrived_pct + 1e-9)
    assert np.all(result.allocated_pct <= 100 + 1e-9)
    assert result.arrived_pct[-1] >= 130


@pytest.mark.parametrize("policy", ["random", DEFAULT_POLICY, "best-fit/random"])
def test_run_seed_is_deterministic(policy: str) -> None:
    nodes = [node("a", 2), node("b", 4), node("c", 8, model="V100")]
    pods = [pod(f"p{i}", m) for i, m in enumerate([250, 500, 1000, 460, 100, 750] * 3)]
    first = run(nodes, pods, policy=policy, seed=11)
    again = run(nodes, pods, policy=policy, seed=11)
    np.testing.assert_array_equal(first.arrived_pct, again.arrived_pct)
    np.testing.assert_array_equal(first.allocated_pct, again.allocated_pct)
    assert first.failed_pods == again.failed_pods
    assert first.failed_pods_at_100 == again.failed_pods_at_100
    assert first.frag_rate_pct_at_100 == again.frag_rate_pct_at_100


def test_pod_drawn_twice_is_placed_twice() -> None:
    # One pod type of a quarter GPU on 1 GPU at 100%: the list has one pod, three more copies
    # are drawn; all four fit (their names must not clash in the ledger).
    result = run([node("n", 1)], [pod("only", 250)], inflate=1.0)
    np.testing.assert_allclose(result.allocated_pct, [25, 50, 75, 100])
    assert result.failed_pods == 0


# -- SeedResult.allocated_at -------------------------------------------------------------------


def seed_result(arrived, allocated) -> SeedResult:
    return SeedResult(
        seed=0,
        arrived_pct=np.array(arrived, dtype=float),
        allocated_pct=np.array(allocated, dtype=float),
        failed_pods_at_100=0,
        failed_pods=0,
        frag_rate_pct_at_100=0.0,
        wall_s=0.0,
    )


@pytest.mark.parametrize(
    ("arrival", "expected"),
    [
        (0, 10),
        (20, 10),
        (20.5, 18),
        (60, 18),
        (99.5, 40),
        (100, 40),
        (100.0000000001, 40),  # within the tolerance of 100
        (101, 45),
        (130, 45),  # never reached: the last value
        (500, 45),
    ],
)
def test_allocated_at(arrival: float, expected: float) -> None:
    result = seed_result([20, 60, 100, 120], [10, 18, 40, 45])
    assert result.allocated_at(arrival) == expected


def test_allocated_at_tolerates_rounding_below_the_point() -> None:
    result = seed_result([50, 99.99999999999999, 110], [50, 95, 96])
    assert result.allocated_at(100) == 95
