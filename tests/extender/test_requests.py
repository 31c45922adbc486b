from __future__ import annotations

import pytest
from extender_helpers import container, pod

from gpushare import protocol
from gpushare.extender.requests import RequestError, Units, parse_pod


def test_share_in_gib_with_core() -> None:
    parsed = parse_pod(pod("p", container(mem=12, core=30)))
    (item,) = parsed.containers
    assert item.container == "main" and not item.init
    request = item.request
    assert request.name == "default/p/main"
    assert (request.gpu_count, request.memory_mib_per_gpu) == (1, 12 * 1024)
    assert request.core_percent_per_gpu == 30 and not request.exclusive


def test_mib_as_a_setting() -> None:
    parsed = parse_pod(pod("p", container(mem=1500)), Units(memory_mib_per_unit=1))
    assert parsed.containers[0].request.memory_mib_per_gpu == 1500


def test_gpu_count_splits_memory_evenly() -> None:
    annotations = {protocol.ANNOTATION_GPU_COUNT: "4"}
    parsed = parse_pod(pod("p", container(mem=32), annotations=annotations))
    request = parsed.containers[0].request
    assert (request.gpu_count, request.memory_mib_per_gpu) == (4, 8 * 1024)


def test_whole_gpus_are_exclusive() -> None:
    request = parse_pod(pod("p", container(gpu=2))).containers[0].request
    assert request.exclusive and request.gpu_count == 2


def test_models_policy_and_init_containers() -> None:
    annotations = {protocol.ANNOTATION_GPU_MODEL: "T4| A10 ", protocol.ANNOTATION_POLICY: "spread"}
    parsed = parse_pod(
        pod(
            "p",
            container("a", mem=2),
            container("cpu-only"),
            container("b", mem=3),
            annotations=annotations,
            init=(container("setup", mem=1),),
        )
    )
    assert [(c.container, c.init) for c in parsed.containers] == [
        ("setup", True),
        ("a", False),
        ("b", False),
    ]
    assert parsed.containers[1].request.allowed_models == {"T4", "A10"}
    assert parsed.policy == "spread"


def test_requests_without_limits_count() -> None:
    the_pod = pod("p")
    the_pod["spec"]["containers"][0]["resources"] = {
        "requests": {protocol.RESOURCE_GPU_MEMORY: "5"}
    }
    assert parse_pod(the_pod).containers[0].request.memory_mib_per_gpu == 5 * 1024


def test_pod_without_gpushare_requests() -> None:
    the_pod = pod("p", {"name": "c", "resources": {"limits": {"cpu": "1"}}})
    assert not parse_pod(the_pod).uses_gpu


@pytest.mark.parametrize(
    ("containers", "annotations", "message"),
    [
        ((container(mem="1.5"),), {}, "gpu-mem must be a whole number, got '1.5'"),
        ((container(mem="500m"),), {}, "must be a whole number"),
        ((container(mem="1Gi"),), {}, "must be a whole number"),
        ((container(mem=-1),), {}, "must be a whole number"),
        ((container(mem=0),), {}, "gpu-mem must be > 0"),
        ((container(mem=4, core=0),), {}, "gpu-core must be 1..100, got 0"),
        ((container(mem=4, core=101),), {}, "gpu-core must be 1..100, got 101"),
        ((container(core=50),), {}, "gpu-core needs gpushare.io/gpu-mem"),
        ((container(gpu=1, mem=4),), {}, "cannot be combined"),
        ((container(mem=1),), {protocol.ANNOTATION_GPU_COUNT: "3"}, "split evenly over 3"),
        ((container(mem=4),), {protocol.ANNOTATION_GPU_COUNT: "0"}, "gpu-count must be"),
        ((container(mem=4),), {protocol.ANNOTATION_GPU_COUNT: "two"}, "gpu-count must be"),
        ((container(gpu=1),), {protocol.ANNOTATION_GPU_COUNT: "2"}, "no container asks"),
        ((container("x", mem=1), container("x", mem=1)), {}, "container x: name used twice"),
    ],
)
def test_malformed_requests_say_why(containers, annotations, message) -> None:
    with pytest.raises(RequestError, match=None) as caught:
        parse_pod(pod("p", *containers, annotations=annotations))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def _aliyun(name: str = "main", **limits: str) -> dict:
    names = {
        "mem": protocol.ALIYUN_RESOURCE_GPU_MEMORY,
        "count": protocol.ALIYUN_RESOURCE_GPU_COUNT,
    }
    return {"name": name, "resources": {"limits": {names[k]: v for k, v in limits.items()}}}


def test_aliyun_names_are_refused_with_a_reason_unless_compat_is_on() -> None:
    with pytest.raises(RequestError, match="only with gpushare extender --compat-aliyun"):
        parse_pod(pod("p", _aliyun(mem="4")))


def test_aliyun_names_with_compat() -> None:
    compat = Units(compat_aliyun=True)
    (item,) = parse_pod(pod("p", _aliyun(mem="4")), compat).containers
    assert (item.request.gpu_count, item.request.memory_mib_per_gpu) == (1, 4 * 1024)
    # gpu-mem is GiB on each GPU whatever --memory-unit says; gpu-count the number of GPUs.
    mib = Units(memory_mib_per_unit=1, compat_aliyun=True)
    (item,) = parse_pod(pod("p", _aliyun(mem="3", count="2")), mib).containers
    assert (item.request.gpu_count, item.request.memory_mib_per_gpu) == (2, 3 * 1024)


@pytest.mark.parametrize(
    ("the_container", "message"),
    [
        (_aliyun(mem="0"), "must be > 0"),
        (_aliyun(count="2"), "needs aliyun.com/gpu-mem"),
        (_aliyun(mem="1.5"), "whole number"),
        (
            {
                "name": "main",
                "resources": {
                    "limits": {
                        protocol.ALIYUN_RESOURCE_GPU_MEMORY: "2",
                        protocol.RESOURCE_GPU_CORE: "20",
                    }
                },
            },
            "cannot be combined",
        ),
    ],
)
def test_bad_aliyun_requests(the_container: dict, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_pod(pod("p", the_container), Units(compat_aliyun=True))
