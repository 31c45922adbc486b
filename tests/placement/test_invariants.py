"""Property tests: random clusters and request sequences, checked against a plain shadow model.

After every step of every policy: no GPU holds more memory or core than it has, an exclusive
GPU has exactly one holder, node CPU and memory never go negative, the ledger agrees with a
shadow kept by hand, a placement is always feasible and a NoFit comes only when no node can
take the request. Releasing everything restores the initial free capacity exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.model import (
    FULL_CORE_PERCENT,
    Allocation,
    Gpu,
    Ledger,
    Node,
    Request,
)
from gpushare.placement.engine import NoFit, Placement, Placer
from gpushare.placement.fragmentation import TargetWorkload
from gpushare.placement.policies import POLICIES

MODELS = ("A10", "A100")
MODEL_CHOICES = (
    frozenset(),
    frozenset(),
    frozenset({"A10"}),
    frozenset({"A100"}),
    frozenset(MODELS),
    frozenset({"H100"}),
)

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- strategies ------------------------------------------------------------------------------


@st.composite
def nodes(draw: st.DrawFn) -> list[Node]:
    result = []
    for n in range(draw(st.integers(2, 4))):
        gpu_count = draw(st.integers(0, 4))
        # Arbitrary distinct GPU indices in arbitrary order, to exercise index-to-slot mapping.
        indices = draw(st.permutations(range(6)))[:gpu_count]
        gpus = tuple(
            Gpu(
                index=index,
                uuid=f"n{n}-gpu{index}",
                model=draw(st.sampled_from(MODELS)),
                memory_mib=draw(st.sampled_from([8000, 16000])),
                healthy=draw(st.sampled_from([True, True, True, False])),
            )
            for index in indices
        )
        cpu = draw(st.sampled_from([2000, 8000, 32000]))
        memory = draw(st.sampled_from([8192, 65536]))
        result.append(Node(f"n{n}", gpus, cpu_milli=cpu, memory_mib=memory))
    return result


@st.composite
def requests(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["shared", "shared", "exclusive", "cpu"]))
    cpu = draw(st.sampled_from([0, 500, 2000, 8000]))
    memory = draw(st.sampled_from([0, 1024, 16384]))
    if kind == "cpu":
        return Request("r", cpu_milli=cpu, memory_mib=memory)
    models = draw(st.sampled_from(MODEL_CHOICES))
    if kind == "exclusive":
        return Request(
            "r",
            cpu_milli=cpu,
            memory_mib=memory,
            gpu_count=draw(st.integers(1, 2)),
            exclusive=True,
            allowed_models=models,
        )
    return Request(
        "r",
        cpu_milli=cpu,
        memory_mib=memory,
        gpu_count=draw(st.sampled_from([1, 1, 1, 2, 3])),
        memory_mib_per_gpu=draw(st.sampled_from([1000, 4000, 6000, 8000, 12000, 16000])),
        core_percent_per_gpu=draw(st.sampled_from([0, 10, 30, 50, 100])),
        allowed_models=models,
    )


operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), requests()),
        st.tuples(st.just("place"), requests()),
        st.tuples(st.just("place"), requests()),
        st.tuples(st.just("release"), st.integers(0, 1000)),
        st.tuples(st.just("health"), st.tuples(st.integers(0, 100), st.integers(0, 100))),
    ),
    min_size=8,
    max_size=30,
)


# -- the shadow model ------------------------------------------------------------------------


@dataclass
class ShadowGpu:
    index: int
    uuid: str
    model: str
    capacity: int
    healthy: bool
    used_memory: int = 0
    used_core: int = 0
    holders: set[str] = field(default_factory=set)
    exclusive_holder: str | None = None

    def takes(self, request: Request) -> bool:
        """Could this GPU take one GPU's worth of the request?"""
        if not self.healthy or not request.allows(self.model):
            return False
        if request.exclusive:
            return not self.holders
        return (
            self.exclusive_holder is None
            and self.capacity - self.used_memory >= request.memory_mib_per_gpu
            and FULL_CORE_PERCENT - self.used_core >= request.core_percent_per_gpu
        )


@dataclass
class ShadowNode:
    name: str
    cpu: int
    memory: int
    gpus: list[ShadowGpu]
    used_cpu: int = 0
    used_memory: int = 0

    def gpu(self, index: int) -> ShadowGpu | None:
        return next((gpu for gpu in self.gpus if gpu.index == index), None)

    def fits(self, request: Request) -> bool:
        if self.cpu - self.used_cpu < request.cpu_milli:
            return False
        if self.memory - self.used_memory < request.memory_mib:
            return False
        return sum(gpu.takes(request) for gpu in self.gpus) >= request.gpu_count


def shadow_of(cluster: list[Node]) -> list[ShadowNode]:
    return [
        ShadowNode(
            node.name,
            node.cpu_milli,
            node.memory_mib,
            [ShadowGpu(g.index, g.uuid, g.model, g.memory_mib, g.healthy) for g in node.gpus],
        )
        for node in cluster
    ]


def check_feasible(shadow: list[ShadowNode], request: Request, allocation: Allocation) -> None:
    """The allocation is a valid answer to the request in the shadow's (pre-)state."""
    node = next(n for n in shadow if n.name == allocation.node_name)
    assert node.fits(request)
    assert allocation.request_name == request.name
    assert allocation.cpu_milli == request.cpu_milli
    assert allocation.memory_mib == request.memory_mib
    assert len(allocation.gpu_shares) == request.gpu_count
    assert len(set(allocation.gpu_indices)) == request.gpu_count
    for share in allocation.gpu_shares:
        gpu = node.gpu(share.index)
        assert gpu is not None
        assert share.uuid == gpu.uuid
        assert gpu.takes(request), (share, gpu)
        assert share.exclusive == request.exclusive
        if request.exclusive:
            assert share.memory_mib == gpu.capacity
            assert share.core_percent == FULL_CORE_PERCENT
        else:
            assert share.memory_mib == request.memory_mib_per_gpu
            assert share.core_percent == request.core_percent_per_gpu


def apply(shadow: list[ShadowNode], allocation: Allocation, sign: int) -> None:
    node = next(n for n in shadow if n.name == allocation.node_name)
    node.used_cpu += sign * allocation.cpu_milli
    node.used_memory += sign * allocation.memory_mib
    for share in allocation.gpu_shares:
        gpu = node.gpu(share.index)
        assert gpu is not None
        gpu.used_memory += sign * share.memory_mib
        gpu.used_core += sign * share.core_percent
        if sign > 0:
            gpu.holders.add(allocation.request_name)
            if share.exclusive:
                gpu.exclusive_holder = allocation.request_name
        else:
            gpu.holders.remove(allocation.request_name)
            if gpu.exclusive_holder == allocation.request_name:
                gpu.exclusive_holder = None


def check_state(ledger: Ledger, shadow: list[ShadowNode]) -> None:
    for i, node in enumerate(shadow):
        assert ledger.nodes[i].name == node.name
        assert 0 <= node.used_cpu <= node.cpu
        assert 0 <= node.used_memory <= node.memory
        assert int(ledger.cpu_free_milli[i]) == node.cpu - node.used_cpu
        assert int(ledger.memory_free_mib[i]) == node.memory - node.used_memory
        assert ledger.cpu_free_milli[i] >= 0
        assert ledger.memory_free_mib[i] >= 0
        for slot, gpu in enumerate(node.gpus):
            where = f"{node.name} GPU {gpu.index}"
            assert int(ledger.gpu_index[i, slot]) == gpu.index, where
            assert 0 <= gpu.used_memory <= gpu.capacity, where
            assert 0 <= gpu.used_core <= FULL_CORE_PERCENT, where
            assert int(ledger.gpu_free_memory_mib[i, slot]) == gpu.capacity - gpu.used_memory
            assert int(ledger.gpu_free_core_percent[i, slot]) == (
                FULL_CORE_PERCENT - gpu.used_core
            ), where
            assert int(ledger.gpu_sharers[i, slot]) == len(gpu.holders), where
            assert bool(ledger.gpu_exclusive[i, slot]) == (gpu.exclusive_holder is not None)
            assert bool(ledger.gpu_healthy[i, slot]) == gpu.healthy, where
            if ledger.gpu_exclusive[i, slot]:
                assert gpu.holders == {gpu.exclusive_holder}, where


def workload_for(ops: list) -> TargetWorkload:
    drawn = [op[1] for op in ops if op[0] == "place"]
    drawn.append(Request("w", cpu_milli=1000, gpu_count=1, memory_mib_per_gpu=8000))
    return TargetWorkload.from_requests(drawn)


# -- the property ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(POLICIES))
@SETTINGS
@given(cluster=nodes(), ops=operations, seed=st.integers(0, 2**16))
def test_invariants_hold_under_random_operations(
    policy: str, cluster: list[Node], ops: list, seed: int
) -> None:
    ledger = Ledger(cluster)
    initial = {
        name: getattr(ledger, name).copy()
        for name in (
            "cpu_free_milli",
            "memory_free_mib",
            "gpu_free_memory_mib",
            "gpu_free_core_percent",
            "gpu_sharers",
            "gpu_exclusive",
        )
    }
    placer = Placer(ledger, policy, workload=workload_for(ops), seed=seed)
    shadow = shadow_of(cluster)
    held: list[str] = []

    for step, (kind, arg) in enumerate(ops):
        if kind == "place":
            request = Request(
                f"r{step}",
                cpu_milli=arg.cpu_milli,
                memory_mib=arg.memory_mib,
                gpu_count=arg.gpu_count,
                memory_mib_per_gpu=arg.memory_mib_per_gpu,
                core_percent_per_gpu=arg.core_percent_per_gpu,
                exclusive=arg.exclusive,
                allowed_models=arg.allowed_models,
            )
            feasible = [node.fits(request) for node in shadow]
            reasons = [placer.reason(request, i) for i in range(len(ledger))]
            assert [reason is None for reason in reasons] == feasible, reasons
            decision = placer.place(request)
            if isinstance(decision, Placement):
                check_feasible(shadow, request, decision.allocation)
                assert ledger.nodes[decision.node_index].name == decision.allocation.node_name
                assert ledger.allocation(request.name) == decision.allocation
                apply(shadow, decision.allocation, +1)
                held.append(request.name)
            else:
                assert isinstance(decision, NoFit)
                assert not any(feasible), "NoFit although a node can take the request"
                assert decision.node_count == len(ledger)
                assert sum(decision.reasons.values()) == len(ledger)
                assert "fits" not in decision.reasons
                assert not ledger.holds(request.name)
        elif kind == "release" and held:
            name = held.pop(arg % len(held))
            allocation = ledger.release(name)
            apply(shadow, allocation, -1)
        elif kind == "health":
            node_pick, gpu_pick = arg
            node = shadow[node_pick % len(shadow)]
            if node.gpus:
                gpu = node.gpus[gpu_pick % len(node.gpus)]
                gpu.healthy = not gpu.healthy
                ledger.set_gpu_health(node.name, gpu.index, gpu.healthy)
        check_state(ledger, shadow)

    for name in held:
        apply(shadow, ledger.release(name), -1)
    check_state(ledger, shadow)
    assert ledger.allocations() == []
    for name, array in initial.items():
        np.testing.assert_array_equal(getattr(ledger, name), array, err_msg=name)
