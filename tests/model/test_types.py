"""Validation of the domain types: a bad value raises ModelError naming where it came from."""

from __future__ import annotations

import dataclasses

import pytest

from gpushare.model import (
    FULL_CORE_PERCENT,
    Allocation,
    Gpu,
    GpuShare,
    ModelError,
    Node,
    Request,
)


def make_gpu(index: int = 0, **overrides) -> Gpu:
    values = {"index": index, "uuid": f"GPU-{index}", "model": "A100", "memory_mib": 16000}
    values.update(overrides)
    return Gpu(**values)


# -- Gpu -------------------------------------------------------------------------------------


def test_gpu_valid_defaults() -> None:
    gpu = make_gpu(3)
    assert (gpu.index, gpu.uuid, gpu.model, gpu.memory_mib) == (3, "GPU-3", "A100", 16000)
    assert gpu.numa_node == 0
    assert gpu.healthy is True
    assert gpu.nvlink_peers == ()


def test_gpu_index_zero_is_allowed() -> None:
    assert make_gpu(0).index == 0


def test_gpu_negative_index_names_uuid_and_value() -> None:
    with pytest.raises(ModelError, match=r"GPU 'GPU-x': index must be >= 0, got -1"):
        make_gpu(-1, uuid="GPU-x")


def test_gpu_empty_uuid_names_index() -> None:
    with pytest.raises(ModelError, match=r"GPU 4: uuid must not be empty"):
        make_gpu(4, uuid="")


def test_gpu_empty_model_names_index() -> None:
    with pytest.raises(ModelError, match=r"GPU 2: model must not be empty"):
        make_gpu(2, model="")


@pytest.mark.parametrize("memory", [0, -1, -16000])
def test_gpu_memory_must_be_positive(memory: int) -> None:
    with pytest.raises(ModelError, match=rf"GPU 1: memory_mib must be > 0, got {memory}"):
        make_gpu(1, memory_mib=memory)


def test_gpu_memory_of_one_mib_is_allowed() -> None:
    assert make_gpu(memory_mib=1).memory_mib == 1


def test_model_error_is_a_value_error() -> None:
    # Callers that catch ValueError (argument parsing, trace loading) also catch ModelError.
    with pytest.raises(ValueError):
        make_gpu(memory_mib=0)


def test_gpu_is_frozen() -> None:
    gpu = make_gpu()
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.memory_mib = 1  # type: ignore[misc]


# -- Node ------------------------------------------------------------------------------------


def test_node_valid_and_gpu_memory_sum() -> None:
    node = Node("n0", (make_gpu(0), make_gpu(1, memory_mib=24000)), cpu_milli=0, memory_mib=0)
    assert node.gpu_memory_mib == 40000
    assert Node("cpu-only", (), cpu_milli=1000, memory_mib=1024).gpu_memory_mib == 0


def test_node_empty_name() -> None:
    with pytest.raises(ModelError, match=r"node name must not be empty"):
        Node("", (), cpu_milli=1000, memory_mib=1024)


def test_node_negative_cpu_names_node() -> None:
    with pytest.raises(ModelError, match=r"node n7: cpu_milli must be >= 0"):
        Node("n7", (), cpu_milli=-1, memory_mib=1024)


def test_node_negative_memory_names_node() -> None:
    with pytest.raises(ModelError, match=r"node n7: memory_mib must be >= 0"):
        Node("n7", (), cpu_milli=1000, memory_mib=-5)


def test_node_duplicate_gpu_index_names_node_and_indices() -> None:
    gpus = (make_gpu(0), make_gpu(1, uuid="a"), make_gpu(1, uuid="b"))
    with pytest.raises(ModelError, match=r"node n1: duplicate GPU index in \[0, 1, 1\]"):
        Node("n1", gpus, cpu_milli=1000, memory_mib=1024)


def test_node_gpu_indices_need_not_be_contiguous() -> None:
    node = Node("n0", (make_gpu(5), make_gpu(2)), cpu_milli=1, memory_mib=1)
    assert [gpu.index for gpu in node.gpus] == [5, 2]


# -- Request ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cpu_milli", -1, r"request 'r': cpu_milli must be >= 0, got -1"),
        ("memory_mib", -2, r"request 'r': memory_mib must be >= 0, got -2"),
        ("gpu_count", -1, r"request 'r': gpu_count must be >= 0, got -1"),
        ("core_percent_per_gpu", -1, r"request 'r': core_percent_per_gpu must be 0..100, got -1"),
        (
            "core_percent_per_gpu",
            101,
            r"request 'r': core_percent_per_gpu must be 0..100, got 101",
        ),
    ],
)
def test_request_field_out_of_range(field: str, value: int, message: str) -> None:
    values = {"gpu_count": 1, "memory_mib_per_gpu": 1000}
    values[field] = value
    with pytest.raises(ModelError, match=message):
        Request("r", **values)


@pytest.mark.parametrize("core", [0, 1, 50, FULL_CORE_PERCENT])
def test_request_core_percent_bounds_inclusive(core: int) -> None:
    request = Request("r", gpu_count=1, memory_mib_per_gpu=1000, core_percent_per_gpu=core)
    assert request.core_percent_per_gpu == core


def test_request_gpu_memory_without_gpus() -> None:
    with pytest.raises(
        ModelError, match=r"request 'r': GPU memory or exclusivity asked for with gpu_count 0"
    ):
        Request("r", gpu_count=0, memory_mib_per_gpu=1000)


def test_request_exclusive_without_gpus() -> None:
    with pytest.raises(
        ModelError, match=r"request 'x': GPU memory or exclusivity asked for with gpu_count 0"
    ):
        Request("x", exclusive=True)


@pytest.mark.parametrize("memory", [0, -1])
def test_request_shared_gpu_needs_memory(memory: int) -> None:
    with pytest.raises(
        ModelError, match=r"request 's': a shared GPU request needs memory_mib_per_gpu > 0"
    ):
        Request("s", gpu_count=2, memory_mib_per_gpu=memory)


def test_request_exclusive_needs_no_memory_per_gpu() -> None:
    request = Request("e", gpu_count=2, exclusive=True)
    assert request.exclusive
    assert request.memory_mib_per_gpu == 0
    assert request.uses_gpu


def test_request_cpu_only() -> None:
    request = Request("c", cpu_milli=500, memory_mib=256)
    assert not request.uses_gpu
    assert request.gpu_count == 0
    assert request.allowed_models == frozenset()


def test_request_uses_gpu() -> None:
    assert Request("g", gpu_count=1, memory_mib_per_gpu=1).uses_gpu
    assert not Request("c").uses_gpu


def test_request_allows_any_model_without_constraint() -> None:
    request = Request("r", gpu_count=1, memory_mib_per_gpu=1000)
    assert request.allows("A10")
    assert request.allows("A100")
    assert request.allows("anything")


def test_request_allows_only_listed_models() -> None:
    request = Request(
        "r", gpu_count=1, memory_mib_per_gpu=1000, allowed_models=frozenset({"A100", "H100"})
    )
    assert request.allows("A100")
    assert request.allows("H100")
    assert not request.allows("A10")
    assert not request.allows("a100")  # exact names, no case folding
    assert not request.allows("")


def test_request_default_allowed_models_not_shared_between_instances() -> None:
    first, second = Request("a"), Request("b")
    assert first.allowed_models == second.allowed_models == frozenset()


# -- GpuShare and Allocation -----------------------------------------------------------------


def test_allocation_gpu_indices_in_share_order() -> None:
    shares = (
        GpuShare(uuid="u3", index=3, memory_mib=1000, core_percent=10),
        GpuShare(uuid="u1", index=1, memory_mib=1000, core_percent=10),
    )
    allocation = Allocation("r", "n0", cpu_milli=100, memory_mib=200, gpu_shares=shares)
    assert allocation.gpu_indices == (3, 1)
    assert Allocation("c", "n0", cpu_milli=1, memory_mib=1).gpu_indices == ()
    assert shares[0].exclusive is False
