"""fgd-pack, our default policy: the terms it adds to FGD each do what they are for."""

from __future__ import annotations

import numpy as np
import pytest

from gpushare.model import Allocation, Gpu, GpuShare, Ledger, Node, Request
from gpushare.placement import policies
from gpushare.placement.engine import Placement, Placer
from gpushare.placement.fragmentation import TargetWorkload

GPU_MIB = 16000

# GPU work needing 8 cores and 32 GiB per GPU; so the policy wants 8.8 cores per free GPU.
WORKLOAD = TargetWorkload.from_requests(
    [Request("whole", cpu_milli=8000, memory_mib=32768, gpu_count=1, exclusive=True)]
)


def node(name: str, cpu_milli: int, memory_mib: int = 1 << 20, gpus: int = 2) -> Node:
    return Node(
        name,
        tuple(Gpu(i, f"{name}-{i}", "A100", GPU_MIB) for i in range(gpus)),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
    )


def first_in_order(placer: Placer) -> str:
    return placer.ledger.nodes[int(np.argmin(placer.context.tie_rank))].name


def test_workload_host_demand_per_gpu() -> None:
    workload = TargetWorkload.from_requests(
        [
            Request("a", cpu_milli=8000, memory_mib=1000, gpu_count=2, exclusive=True),
            Request("b", cpu_milli=4000, memory_mib=500, gpu_count=1, memory_mib_per_gpu=8000),
            Request("cpu", cpu_milli=64000, memory_mib=9999),  # no GPU: not in the ratio
        ],
        gpu_memory_mib=GPU_MIB,
    )
    # 2 + 0.5 GPUs; 12000 milli and 1500 MiB over them.
    assert workload.cpu_milli_per_gpu == pytest.approx(12000 / 2.5)
    assert workload.host_memory_mib_per_gpu == pytest.approx(1500 / 2.5)


@pytest.mark.parametrize("seed", range(6))
def test_stranding_sends_cpu_heavy_work_to_the_cpu_rich_node(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Taking 10 cores leaves the poor node 10 cores for 2 GPUs: FGD sees no change (the
    # typical task still fits), but the node can then feed only 1.1 GPUs at 8.8 cores each.
    monkeypatch.setattr(policies, "PACKING_ORDER_WEIGHT", 0.0)
    ledger = Ledger([node("poor", cpu_milli=20000), node("rich", cpu_milli=104000)])
    decision = Placer(ledger, "fgd-pack", workload=WORKLOAD, seed=seed).place(
        Request("cpu-job", cpu_milli=10000)
    )
    assert isinstance(decision, Placement)
    assert decision.allocation.node_name == "rich"


def test_without_the_stranding_term_fgd_cannot_tell_the_nodes_apart() -> None:
    # The same situation under plain FGD: a tie, decided by the seeded order alone.
    chosen = set()
    for seed in range(8):
        ledger = Ledger([node("poor", cpu_milli=20000), node("rich", cpu_milli=104000)])
        placer = Placer(ledger, "fgd", workload=WORKLOAD, seed=seed)
        decision = placer.place(Request("cpu-job", cpu_milli=10000))
        assert isinstance(decision, Placement)
        assert decision.allocation.node_name == first_in_order(placer)
        chosen.add(decision.allocation.node_name)
    assert chosen == {"poor", "rich"}


@pytest.mark.parametrize("seed", range(6))
def test_memory_strands_gpus_too(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policies, "PACKING_ORDER_WEIGHT", 0.0)
    ledger = Ledger(
        [
            node("small-memory", cpu_milli=200000, memory_mib=80000),
            node("large-memory", cpu_milli=200000, memory_mib=1 << 20),
        ]
    )
    decision = Placer(ledger, "fgd-pack", workload=WORKLOAD, seed=seed).place(
        Request("memory-job", cpu_milli=1000, memory_mib=40000)
    )
    assert isinstance(decision, Placement)
    assert decision.allocation.node_name == "large-memory"


@pytest.mark.parametrize("seed", range(6))
def test_packing_order_keeps_filling_the_first_node(seed: int) -> None:
    workload = TargetWorkload.from_requests(
        [Request("half", cpu_milli=1000, gpu_count=1, memory_mib_per_gpu=8000)]
    )
    ledger = Ledger([node(f"n{i}", cpu_milli=64000) for i in range(4)])
    placer = Placer(ledger, "fgd-pack", workload=workload, seed=seed)
    names = set()
    for k in range(4):  # four half-GPU tasks fill exactly one 2-GPU node
        decision = placer.place(
            Request(f"t{k}", cpu_milli=1000, gpu_count=1, memory_mib_per_gpu=8000)
        )
        assert isinstance(decision, Placement)
        names.add(decision.allocation.node_name)
    assert names == {first_in_order(placer)}
    assert ledger.gpu_free_memory_mib[ledger.node_index[first_in_order(placer)]].tolist() == [0, 0]


@pytest.mark.parametrize("seed", range(8))
def test_packing_order_outweighs_a_small_fragmentation_difference(seed: int) -> None:
    # On "busy" (4000 MiB used on each GPU) a half-GPU task leaves a GPU too small for the next
    # one: fragmentation grows by a quarter GPU. On "empty" it grows by nothing. The packing
    # order is worth up to one GPU across the cluster, so the earlier node wins either way.
    workload = TargetWorkload.from_requests(
        [Request("half", cpu_milli=1000, gpu_count=1, memory_mib_per_gpu=8000)]
    )
    ledger = Ledger([node("busy", cpu_milli=64000), node("empty", cpu_milli=64000)])
    for gpu in ledger.nodes[0].gpus:
        ledger.reserve(
            Allocation(
                f"pre-{gpu.index}",
                "busy",
                cpu_milli=0,
                memory_mib=0,
                gpu_shares=(GpuShare(gpu.uuid, gpu.index, 4000, 0),),
            )
        )
    placer = Placer(ledger, "fgd-pack", workload=workload, seed=seed)
    decision = placer.place(Request("t", cpu_milli=1000, gpu_count=1, memory_mib_per_gpu=8000))
    assert isinstance(decision, Placement)
    assert decision.allocation.node_name == first_in_order(placer)
