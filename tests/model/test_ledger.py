"""The ledger's arithmetic and the invariants it enforces on reserve and release."""

from __future__ import annotations

import numpy as np
import pytest

from gpushare.model import (
    FULL_CORE_PERCENT,
    Allocation,
    CapacityError,
    Gpu,
    GpuShare,
    Ledger,
    ModelError,
    Node,
)
from gpushare.model.ledger import NO_GPU

GPU_MIB = 16000


def make_node(
    name: str,
    indices: tuple[int, ...] = (0, 1),
    cpu: int = 8000,
    memory: int = 32768,
    gpu_mib: int = GPU_MIB,
    model: str = "A100",
) -> Node:
    gpus = tuple(
        Gpu(index=i, uuid=f"{name}-gpu{i}", model=model, memory_mib=gpu_mib) for i in indices
    )
    return Node(name, gpus, cpu_milli=cpu, memory_mib=memory)


def share(node: str, index: int, memory: int, core: int = 10, exclusive: bool = False) -> GpuShare:
    return GpuShare(
        uuid=f"{node}-gpu{index}",
        index=index,
        memory_mib=memory,
        core_percent=core,
        exclusive=exclusive,
    )


def exclusive_share(node: str, index: int) -> GpuShare:
    return share(node, index, GPU_MIB, FULL_CORE_PERCENT, exclusive=True)


def alloc(name: str, node: str, *shares: GpuShare, cpu: int = 0, memory: int = 0) -> Allocation:
    return Allocation(name, node, cpu_milli=cpu, memory_mib=memory, gpu_shares=shares)


@pytest.fixture
def ledger() -> Ledger:
    # n1's GPUs are indexed 3 and 1 (in that order) to check index-to-slot mapping.
    return Ledger([make_node("n0"), make_node("n1", indices=(3, 1)), make_node("cpu", ())])


def snapshot(ledger: Ledger) -> dict[str, np.ndarray]:
    names = (
        "cpu_free_milli",
        "memory_free_mib",
        "gpu_free_memory_mib",
        "gpu_free_core_percent",
        "gpu_sharers",
        "gpu_exclusive",
        "gpu_healthy",
    )
    return {name: getattr(ledger, name).copy() for name in names}


def assert_same(before: dict[str, np.ndarray], ledger: Ledger) -> None:
    after = snapshot(ledger)
    for name, array in before.items():
        np.testing.assert_array_equal(after[name], array, err_msg=name)


# -- construction ----------------------------------------------------------------------------


def test_initial_arrays(ledger: Ledger) -> None:
    assert len(ledger) == 3
    assert ledger.gpu_width == 2
    assert ledger.models == ("A100",)
    np.testing.assert_array_equal(ledger.gpu_count, [2, 2, 0])
    np.testing.assert_array_equal(ledger.cpu_free_milli, [8000, 8000, 8000])
    np.testing.assert_array_equal(ledger.memory_free_mib, [32768, 32768, 32768])
    np.testing.assert_array_equal(ledger.gpu_index, [[0, 1], [3, 1], [NO_GPU, NO_GPU]])
    np.testing.assert_array_equal(
        ledger.gpu_free_memory_mib, [[GPU_MIB, GPU_MIB], [GPU_MIB, GPU_MIB], [NO_GPU, NO_GPU]]
    )
    np.testing.assert_array_equal(ledger.gpu_free_core_percent, [[100, 100], [100, 100], [-1, -1]])
    np.testing.assert_array_equal(
        ledger.gpu_fully_free(), [[True, True], [True, True], [False, False]]
    )
    np.testing.assert_array_equal(ledger.node_version, [0, 0, 0])
    assert ledger.allocations() == []


def test_models_sorted_and_ids() -> None:
    mixed = Ledger([make_node("a", model="T4"), make_node("b", model="A10")])
    assert mixed.models == ("A10", "T4")
    np.testing.assert_array_equal(mixed.gpu_model_id, [[1, 1], [0, 0]])


def test_duplicate_node_names() -> None:
    with pytest.raises(ModelError, match=r"duplicate node names: a, b"):
        Ledger([make_node("b"), make_node("a"), make_node("b"), make_node("a")])


def test_empty_ledger() -> None:
    empty = Ledger([])
    assert len(empty) == 0
    assert empty.gpu_width == 0


def test_slot_of(ledger: Ledger) -> None:
    assert ledger.slot_of(1, 3) == 0
    assert ledger.slot_of(1, 1) == 1
    with pytest.raises(CapacityError, match=r"node n1 has no GPU with index 0"):
        ledger.slot_of(1, 0)


# -- reserve and release arithmetic ----------------------------------------------------------


def test_reserve_shared_arithmetic(ledger: Ledger) -> None:
    allocation = alloc(
        "a", "n1", share("n1", 1, 6000, 30), share("n1", 3, 4000, 20), cpu=1500, memory=4096
    )
    ledger.reserve(allocation)
    np.testing.assert_array_equal(ledger.cpu_free_milli, [8000, 6500, 8000])
    np.testing.assert_array_equal(ledger.memory_free_mib, [32768, 28672, 32768])
    # n1: slot 0 is GPU 3, slot 1 is GPU 1.
    np.testing.assert_array_equal(ledger.gpu_free_memory_mib[1], [12000, 10000])
    np.testing.assert_array_equal(ledger.gpu_free_core_percent[1], [80, 70])
    np.testing.assert_array_equal(ledger.gpu_sharers[1], [1, 1])
    np.testing.assert_array_equal(ledger.gpu_exclusive[1], [False, False])
    np.testing.assert_array_equal(ledger.gpu_free_memory_mib[0], [GPU_MIB, GPU_MIB])
    np.testing.assert_array_equal(ledger.node_version, [0, 1, 0])
    assert ledger.holds("a")
    assert ledger.allocation("a") == allocation
    assert ledger.allocations() == [allocation]


def test_two_shares_on_one_gpu_add_up(ledger: Ledger) -> None:
    ledger.reserve(alloc("a", "n0", share("n0", 0, 6000, 30)))
    ledger.reserve(alloc("b", "n0", share("n0", 0, 10000, 70)))
    assert ledger.gpu_free_memory_mib[0, 0] == 0
    assert ledger.gpu_free_core_percent[0, 0] == 0
    assert ledger.gpu_sharers[0, 0] == 2
    assert not ledger.gpu_fully_free()[0, 0]
    assert ledger.gpu_fully_free()[0, 1]


def test_reserve_exactly_everything(ledger: Ledger) -> None:
    ledger.reserve(
        alloc(
            "all",
            "n0",
            share("n0", 0, GPU_MIB, 100),
            share("n0", 1, GPU_MIB, 100),
            cpu=8000,
            memory=32768,
        )
    )
    assert ledger.cpu_free_milli[0] == 0
    assert ledger.memory_free_mib[0] == 0
    np.testing.assert_array_equal(ledger.gpu_free_memory_mib[0], [0, 0])


def test_cpu_only_allocation_on_gpu_less_node(ledger: Ledger) -> None:
    ledger.reserve(alloc("c", "cpu", cpu=3000, memory=1024))
    np.testing.assert_array_equal(ledger.cpu_free_milli, [8000, 8000, 5000])
    np.testing.assert_array_equal(ledger.memory_free_mib, [32768, 32768, 31744])
    np.testing.assert_array_equal(ledger.node_version, [0, 0, 1])


def test_release_restores_exact_state_and_bumps_version(ledger: Ledger) -> None:
    before = snapshot(ledger)
    first = alloc("a", "n1", share("n1", 3, 5000, 25), cpu=100, memory=100)
    second = alloc("b", "n1", exclusive_share("n1", 1), cpu=200, memory=200)
    ledger.reserve(first)
    ledger.reserve(second)
    assert ledger.node_version[1] == 2
    assert ledger.release("a") == first
    assert ledger.node_version[1] == 3
    assert not ledger.holds("a")
    assert ledger.holds("b")
    assert ledger.release("b") == second
    assert ledger.node_version[1] == 4
    assert_same(before, ledger)
    np.testing.assert_array_equal(ledger.node_version, [0, 4, 0])
    assert ledger.allocations() == []


def test_release_unknown_raises_key_error(ledger: Ledger) -> None:
    with pytest.raises(KeyError):
        ledger.release("nobody")
    ledger.reserve(alloc("a", "n0", share("n0", 0, 1000)))
    ledger.release("a")
    with pytest.raises(KeyError):
        ledger.release("a")


def test_name_can_be_reused_after_release(ledger: Ledger) -> None:
    ledger.reserve(alloc("a", "n0", share("n0", 0, 1000)))
    ledger.release("a")
    ledger.reserve(alloc("a", "n1", share("n1", 3, 1000)))
    assert ledger.allocation("a").node_name == "n1"


# -- capacity errors -------------------------------------------------------------------------


def test_gpu_memory_overshoot_names_gpu_and_amount(ledger: Ledger) -> None:
    ledger.reserve(alloc("a", "n1", share("n1", 3, 10000)))
    before = snapshot(ledger)
    with pytest.raises(CapacityError, match=r"^node n1 GPU 3: memory over by 250 MiB$"):
        ledger.reserve(alloc("b", "n1", share("n1", 3, 6250)))
    assert_same(before, ledger)
    assert not ledger.holds("b")


def test_gpu_core_overshoot_names_gpu_and_amount(ledger: Ledger) -> None:
    ledger.reserve(alloc("a", "n0", share("n0", 1, 1000, 70)))
    with pytest.raises(CapacityError, match=r"^node n0 GPU 1: core over by 20 percent$"):
        ledger.reserve(alloc("b", "n0", share("n0", 1, 1000, 50)))


def test_core_exactly_full_is_fine(ledger: Ledger) -> None:
    ledger.reserve(alloc("a", "n0", share("n0", 1, 1000, 70)))
    ledger.reserve(alloc("b", "n0", share("n0", 1, 1000, 30)))
    assert ledger.gpu_free_core_percent[0, 1] == 0


def test_cpu_overshoot(ledger: Ledger) -> None:
    ledger.reserve(alloc("a", "n0", cpu=7000))
    with pytest.raises(CapacityError, match=r"^node n0: CPU over by 500 milli$"):
        ledger.reserve(alloc("b", "n0", cpu=1500))


def test_host_memory_overshoot(ledger: Ledger) -> None:
    ledger.reserve(alloc("a", "n1", memory=30000))
    with pytest.raises(CapacityError, match=r"^node n1: host memory over by 1232 MiB$"):
        ledger.reserve(alloc("b", "n1", memory=4000))


def test_failure_on_second_share_changes_nothing(ledger: Ledger) -> None:
    ledger.reserve(alloc("a", "n0", share("n0", 1, 12000)))
    before = snapshot(ledger)
    versions = ledger.node_version.copy()
    bad = alloc("b", "n0", share("n0", 0, 8000), share("n0", 1, 8000), cpu=100, memory=100)
    with pytest.raises(CapacityError, match=r"node n0 GPU 1: memory over by 4000 MiB"):
        ledger.reserve(bad)
    assert_same(before, ledger)
    np.testing.assert_array_equal(ledger.node_version, versions)
    assert not ledger.holds("b")


def test_same_gpu_named_twice(ledger: Ledger) -> None:
    with pytest.raises(CapacityError, match=r"'a': a GPU is named twice"):
        ledger.reserve(alloc("a", "n0", share("n0", 0, 1000), share("n0", 0, 1000)))
    assert ledger.gpu_sharers[0, 0] == 0


def test_double_reserve_of_same_request_name(ledger: Ledger) -> None:
    ledger.reserve(alloc("a", "n0", share("n0", 0, 1000)))
    before = snapshot(ledger)
    with pytest.raises(CapacityError, match=r"'a' is already allocated"):
        ledger.reserve(alloc("a", "n1", share("n1", 1, 1000)))
    assert_same(before, ledger)
    assert ledger.allocation("a").node_name == "n0"


def test_unknown_node(ledger: Ledger) -> None:
    with pytest.raises(CapacityError, match=r"'a': unknown node n9"):
        ledger.reserve(alloc("a", "n9"))
    assert not ledger.holds("a")


def test_unknown_gpu_index(ledger: Ledger) -> None:
    with pytest.raises(CapacityError, match=r"node n1 has no GPU with index 0"):
        ledger.reserve(alloc("a", "n1", share("n1", 0, 1000)))


def test_wrong_uuid(ledger: Ledger) -> None:
    wrong = GpuShare(uuid="n0-gpu1", index=0, memory_mib=1000, core_percent=10)
    with pytest.raises(CapacityError, match=r"node n0 GPU 0: uuid n0-gpu1 is not n0-gpu0"):
        ledger.reserve(alloc("a", "n0", wrong))
    assert ledger.gpu_sharers[0].sum() == 0


# -- exclusivity -----------------------------------------------------------------------------


def test_exclusive_then_shared_refused(ledger: Ledger) -> None:
    ledger.reserve(alloc("x", "n1", exclusive_share("n1", 3)))
    assert ledger.gpu_exclusive[1, 0]
    assert ledger.gpu_sharers[1, 0] == 1
    assert not ledger.gpu_fully_free()[1, 0]
    with pytest.raises(
        CapacityError, match=r"node n1 GPU 3: held exclusively, cannot take another share"
    ):
        ledger.reserve(alloc("s", "n1", share("n1", 3, 0, 0)))
    assert ledger.gpu_sharers[1, 0] == 1


def test_exclusive_then_exclusive_refused(ledger: Ledger) -> None:
    ledger.reserve(alloc("x", "n0", exclusive_share("n0", 0)))
    with pytest.raises(CapacityError, match=r"node n0 GPU 0: held exclusively"):
        ledger.reserve(alloc("y", "n0", exclusive_share("n0", 0)))


def test_shared_then_exclusive_refused(ledger: Ledger) -> None:
    ledger.reserve(alloc("s1", "n0", share("n0", 1, 100, 1)))
    ledger.reserve(alloc("s2", "n0", share("n0", 1, 100, 1)))
    with pytest.raises(
        CapacityError, match=r"node n0 GPU 1: exclusive use asked but 2 share\(s\) hold it"
    ):
        ledger.reserve(alloc("x", "n0", exclusive_share("n0", 1)))
    assert not ledger.gpu_exclusive[0, 1]


def test_exclusive_released_frees_gpu_for_sharing(ledger: Ledger) -> None:
    ledger.reserve(alloc("x", "n0", exclusive_share("n0", 0)))
    ledger.release("x")
    assert not ledger.gpu_exclusive[0, 0]
    assert ledger.gpu_fully_free()[0, 0]
    ledger.reserve(alloc("s", "n0", share("n0", 0, 1000)))
    ledger.reserve(alloc("t", "n0", share("n0", 0, 1000)))
    assert ledger.gpu_sharers[0, 0] == 2


# -- health ----------------------------------------------------------------------------------


def test_set_gpu_health(ledger: Ledger) -> None:
    ledger.set_gpu_health("n1", 1, False)
    np.testing.assert_array_equal(ledger.gpu_healthy[1], [True, False])
    np.testing.assert_array_equal(ledger.node_version, [0, 1, 0])
    np.testing.assert_array_equal(ledger.gpu_fully_free()[1], [True, False])
    ledger.set_gpu_health("n1", 1, True)
    np.testing.assert_array_equal(ledger.gpu_healthy[1], [True, True])
    np.testing.assert_array_equal(ledger.node_version, [0, 2, 0])
    # Free capacity is untouched by health changes.
    np.testing.assert_array_equal(ledger.gpu_free_memory_mib[1], [GPU_MIB, GPU_MIB])


def test_set_gpu_health_unknown_gpu(ledger: Ledger) -> None:
    with pytest.raises(CapacityError, match=r"node n1 has no GPU with index 2"):
        ledger.set_gpu_health("n1", 2, False)
    np.testing.assert_array_equal(ledger.node_version, [0, 0, 0])


def test_unhealthy_from_construction() -> None:
    gpus = (
        Gpu(0, "u0", "A100", GPU_MIB),
        Gpu(1, "u1", "A100", GPU_MIB, healthy=False),
    )
    ledger = Ledger([Node("n", gpus, cpu_milli=1, memory_mib=1)])
    np.testing.assert_array_equal(ledger.gpu_healthy[0], [True, False])
    np.testing.assert_array_equal(ledger.gpu_fully_free()[0], [True, False])


def test_node_allocations_lists_what_each_node_holds() -> None:
    ledger = Ledger([Node("a", (), 4000, 4096), Node("b", (), 4000, 4096)])
    first = Allocation("x", "a", cpu_milli=1000, memory_mib=0)
    second = Allocation("y", "b", cpu_milli=1000, memory_mib=0)
    third = Allocation("z", "a", cpu_milli=1000, memory_mib=0)
    for allocation in (first, second, third):
        ledger.reserve(allocation)
    assert ledger.node_allocations("a") == [first, third]
    assert ledger.node_allocations("b") == [second]
    ledger.release("x")
    assert ledger.node_allocations("a") == [third]
