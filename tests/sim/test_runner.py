"""Running policies over seeds, serially or in worker processes, and averaging the results."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from gpushare.model import Gpu, Node
from gpushare.placement.policies import DEFAULT_POLICY
from gpushare.sim.runner import CURVE_ARRIVAL_PCT, PolicySummary, SimulationSpec, simulate
from gpushare.sim.simulator import REPORT_POINTS_PCT, SeedResult
from gpushare.sim.trace import SIM_GPU_MEMORY_MIB, TracePod, trace_request


def node(name: str, gpus: int, model: str = "T4") -> Node:
    return Node(
        name=name,
        gpus=tuple(
            Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=SIM_GPU_MEMORY_MIB)
            for i in range(gpus)
        ),
        cpu_milli=64000,
        memory_mib=262144,
    )


def pod(name: str, gpu_milli: int, gpu_count: int = 1) -> TracePod:
    request = trace_request(name, 4000, 8192, gpu_count, gpu_milli)
    return TracePod(request, gpu_count * gpu_milli)


def spec(policies, seeds, workers: int) -> SimulationSpec:
    nodes = [node("a", 2), node("b", 4), node("c", 8, model="V100"), node("d", 1)]
    shapes = [(250, 1), (500, 1), (1000, 2), (460, 1), (1000, 1), (750, 1), (100, 1)]
    pods = [pod(f"p{i}", m, c) for i, (m, c) in enumerate(shapes * 2)]
    return SimulationSpec(
        nodes=nodes,
        pods=pods,
        policies=policies,
        seeds=seeds,
        inflate=1.3,
        nodes_path=Path("nodes.csv"),
        pods_path=Path("pods.csv"),
        workers=workers,
    )


def without_time(summary: PolicySummary) -> dict:
    fields = dataclasses.asdict(summary)
    del fields["wall_s"]
    return fields


POLICIES = list(dict.fromkeys([DEFAULT_POLICY, "random", "best-fit"]))
SEEDS = [5, 1, 3]


def test_serial_and_parallel_runs_agree() -> None:
    serial = simulate(spec(POLICIES, SEEDS, workers=1))
    parallel = simulate(spec(POLICIES, SEEDS, workers=2))
    assert [without_time(s) for s in serial] == [without_time(s) for s in parallel]


def test_summaries_come_in_policy_order_with_seeds_in_given_order() -> None:
    summaries = simulate(spec(POLICIES, SEEDS, workers=2))
    assert [s.policy for s in summaries] == POLICIES
    assert all(s.seeds == tuple(SEEDS) for s in summaries)


def test_progress_callback_sees_every_task_once() -> None:
    calls = []

    def on_done(policy: str, result: SeedResult, done: int, total: int) -> None:
        calls.append((policy, result.seed, done, total))

    simulate(spec(POLICIES, SEEDS, workers=1), on_done)
    total = len(POLICIES) * len(SEEDS)
    assert [c[2] for c in calls] == list(range(1, total + 1))
    assert {c[3] for c in calls} == {total}
    assert sorted((p, s) for p, s, _, _ in calls) == sorted((p, s) for p in POLICIES for s in SEEDS)


def test_progress_callback_with_workers() -> None:
    calls = []
    simulate(
        spec(POLICIES, SEEDS, workers=2),
        lambda policy, result, done, total: calls.append((policy, result.seed, done, total)),
    )
    total = len(POLICIES) * len(SEEDS)
    assert [c[2] for c in calls] == list(range(1, total + 1))
    assert len({(p, s) for p, s, _, _ in calls}) == total


def test_more_workers_than_tasks() -> None:
    (summary,) = simulate(spec(["random"], [1], workers=64))
    assert summary.seeds == (1,)


def test_same_seeds_give_same_summary() -> None:
    first = simulate(spec(["random"], [2, 4], workers=1))
    again = simulate(spec(["random"], [2, 4], workers=1))
    assert without_time(first[0]) == without_time(again[0])


# -- PolicySummary -------------------------------------------------------------------------------


def seed_result(seed, arrived, allocated, failed=0, frag=0.0, wall=0.0) -> SeedResult:
    return SeedResult(
        seed=seed,
        arrived_pct=np.array(arrived, dtype=float),
        allocated_pct=np.array(allocated, dtype=float),
        failed_pods_at_100=0,
        failed_pods=failed,
        frag_rate_pct_at_100=frag,
        wall_s=wall,
    )


def test_summary_means_and_sample_std_over_seeds() -> None:
    arrived = [50, 90, 100, 110, 130]
    results = [
        seed_result(1, arrived, [50, 88, 90, 92, 95], failed=3, frag=10.0, wall=1.5),
        seed_result(2, arrived, [50, 82, 80, 85, 85], failed=6, frag=30.0, wall=2.0),
    ]
    summary = PolicySummary.of("x", results)

    assert summary.policy == "x"
    assert summary.seeds == (1, 2)
    assert set(summary.alloc_pct) == {str(p) for p in REPORT_POINTS_PCT}
    assert set(summary.alloc_pct_std) == {str(p) for p in REPORT_POINTS_PCT}
    assert summary.alloc_pct["90"] == pytest.approx(85)
    assert summary.alloc_pct["100"] == pytest.approx(85)
    assert summary.alloc_pct["110"] == pytest.approx(88.5)
    assert summary.alloc_pct["130"] == pytest.approx(90)
    # Sample standard deviation (n - 1): for two values, |a - b| / sqrt(2).
    assert summary.alloc_pct_std["90"] == pytest.approx(6 / np.sqrt(2))
    assert summary.alloc_pct_std["100"] == pytest.approx(10 / np.sqrt(2))
    assert summary.alloc_pct_std["130"] == pytest.approx(10 / np.sqrt(2))
    assert summary.unallocated_pct_at_100 == pytest.approx(15)
    assert summary.unallocated_pct_at_100_std == pytest.approx(10 / np.sqrt(2))
    assert summary.frag_rate_pct_at_100 == pytest.approx(20)
    assert summary.failed_pods == pytest.approx(4.5)
    assert summary.wall_s == pytest.approx(3.5)  # summed, not averaged


def test_summary_of_one_seed_has_zero_std() -> None:
    summary = PolicySummary.of("x", [seed_result(9, [60, 100, 140], [60, 97, 98])])
    assert summary.unallocated_pct_at_100 == pytest.approx(3)
    assert summary.unallocated_pct_at_100_std == 0.0
    assert all(v == 0.0 for v in summary.alloc_pct_std.values())
    assert summary.alloc_pct["110"] == 98


def test_summary_curve_is_the_mean_allocation_at_each_arrival_point() -> None:
    results = [
        seed_result(1, [40, 80, 120, 130], [40, 80, 100, 100]),
        seed_result(2, [40, 80, 120, 130], [40, 70, 90, 90]),
    ]
    summary = PolicySummary.of("x", results)
    assert len(summary.curve_alloc_pct) == len(CURVE_ARRIVAL_PCT) == 131
    curve = dict(zip(CURVE_ARRIVAL_PCT, summary.curve_alloc_pct, strict=True))
    assert curve[0.0] == 40
    assert curve[40.0] == 40
    assert curve[41.0] == 75
    assert curve[80.0] == 75
    assert curve[81.0] == 95
    assert curve[130.0] == 95
