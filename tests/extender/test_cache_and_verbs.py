from __future__ import annotations

import json

import pytest
from extender_helpers import FakeBinder, args, container, node, pod

from gpushare import protocol
from gpushare.extender import verbs
from gpushare.extender.cache import ClusterCache
from gpushare.extender.requests import Units
from gpushare.extender.server import Extender

GIB = 1024


def make_cache(*nodes) -> ClusterCache:
    cache = ClusterCache()
    cache.replace_nodes(list(nodes) or [node("n1"), node("n2")])
    cache.replace_pods([])
    return cache


def bound(cache: ClusterCache, binder: FakeBinder, the_pod: dict, node_name: str) -> dict:
    """Filter and bind ``the_pod`` to ``node_name`` as kube-scheduler would; the bound pod."""
    extender = Extender(cache, binder)
    result = extender.filter(args(the_pod, node_name))
    assert result["nodenames"] == [node_name], result
    meta = the_pod["metadata"]
    answer = extender.bind(
        {
            "podName": meta["name"],
            "podNamespace": meta["namespace"],
            "podUID": meta["uid"],
            "node": node_name,
        }
    )
    assert answer == {}, answer
    key = f"{meta['namespace']}/{meta['name']}"
    the_pod["metadata"]["annotations"].update(binder.annotations[key])
    the_pod["spec"]["nodeName"] = node_name
    return the_pod


def shares(the_pod: dict) -> dict:
    return json.loads(the_pod["metadata"]["annotations"][protocol.ANNOTATION_ALLOCATION])


def test_filter_passes_fitting_nodes_and_says_why_when_none_fits() -> None:
    cache = make_cache(node("small", memory_gib=16), node("big", memory_gib=80))
    result = verbs.filter_nodes(cache, args(pod("p", container(mem=40)), "small", "big", "ghost"))
    assert result["nodenames"] == ["big"]
    # kube-scheduler uses the others' reasons only for a pod that fits nowhere: none spent.
    assert result["failedNodes"] == {}
    assert "failedAndUnresolvableNodes" not in result
    result = verbs.filter_nodes(cache, args(pod("p", container(mem=90)), "small", "big", "ghost"))
    assert result["nodenames"] == []
    assert result["failedAndUnresolvableNodes"] == {
        "small": "no GPU with 90 GiB free (largest free: 16 GiB on GPU 0)",
        "big": "no GPU with 90 GiB free (largest free: 80 GiB on GPU 0)",
        "ghost": "node not known to gpushare",
    }


def test_full_node_is_resolvable_failure_and_message_is_grouped() -> None:
    cache = make_cache(node("n1", gpus=1), node("n2", gpus=1))
    binder = FakeBinder()
    bound(cache, binder, pod("a", container(mem=10)), "n1")
    bound(cache, binder, pod("b", container(mem=10)), "n2")
    result = verbs.filter_nodes(cache, args(pod("c", container(mem=10)), "n1", "n2"))
    assert result["nodenames"] == []
    assert set(result["failedNodes"]) == {"n1", "n2"}
    assert verbs.no_fit_message(result) == (
        "0/2 nodes are available: 2 no GPU with 10 GiB free (largest free: 6 GiB on GPU 0)."
    )


def test_malformed_pod_fails_every_node_with_its_reason() -> None:
    cache = make_cache()
    result = verbs.filter_nodes(cache, args(pod("p", container(mem=4, core=0)), "n1", "n2"))
    assert result["nodenames"] == []
    assert set(result["failedAndUnresolvableNodes"].values()) == {
        "container main: gpushare.io/gpu-core must be 1..100, got 0"
    }


def test_model_not_allowed_and_disabled_node() -> None:
    cache = make_cache(node("t4"), node("off", enabled=False))
    the_pod = pod("p", container(mem=1), annotations={protocol.ANNOTATION_GPU_MODEL: "A100"})
    result = verbs.filter_nodes(cache, args(the_pod, "t4", "off"))
    assert result["failedAndUnresolvableNodes"] == {
        "t4": "GPU model T4 not allowed",
        "off": "gpushare not usable: gpushare.io/enabled is not true",
    }


def test_binpack_fills_a_gpu_before_the_next() -> None:
    cache = make_cache(node("n1", gpus=2, memory_gib=16))
    binder = FakeBinder()
    indices = []
    for i in range(4):
        placed = bound(cache, binder, pod(f"p{i}", container(mem=8)), "n1")
        indices.append(shares(placed)["main"][0]["index"])
    assert indices == [0, 0, 1, 1]


def test_spread_policy_from_node_label() -> None:
    cache = make_cache(node("n1", gpus=2, memory_gib=16, policy="spread"))
    binder = FakeBinder()
    indices = [
        shares(bound(cache, binder, pod(f"p{i}", container(mem=4)), "n1"))["main"][0]["index"]
        for i in range(2)
    ]
    assert indices == [0, 1]


def test_multi_gpu_share_lands_on_distinct_gpus() -> None:
    cache = make_cache(node("n1", gpus=4))
    the_pod = pod("p", container(mem=8), annotations={protocol.ANNOTATION_GPU_COUNT: "4"})
    placed = shares(bound(cache, FakeBinder(), the_pod, "n1"))["main"]
    assert sorted(s["index"] for s in placed) == [0, 1, 2, 3]
    assert {s["memoryMiB"] for s in placed} == {2 * GIB}


def test_exclusive_gets_whole_gpus_that_no_share_then_uses() -> None:
    cache = make_cache(node("n1", gpus=2))
    binder = FakeBinder()
    whole = shares(bound(cache, binder, pod("x", container(gpu=1)), "n1"))["main"]
    assert whole == [
        {"uuid": "GPU-n1-0", "index": 0, "memoryMiB": 16 * GIB, "core": 100, "exclusive": True}
    ]
    share = shares(bound(cache, binder, pod("s", container(mem=1)), "n1"))["main"]
    assert share[0]["index"] == 1
    result = verbs.filter_nodes(cache, args(pod("y", container(gpu=1)), "n1"))
    assert result["failedNodes"] == {"n1": "0 whole free GPU(s), need 1"}


def test_two_containers_and_init_container_on_one_node() -> None:
    cache = make_cache(node("n1", gpus=2, memory_gib=16))
    the_pod = pod(
        "p",
        container("a", mem=10),
        container("b", mem=10),
        init=(container("setup", mem=2),),
    )
    placed = shares(bound(cache, FakeBinder(), the_pod, "n1"))
    assert set(placed) == {"a", "b", "setup"}
    assert placed["a"][0]["index"] != placed["b"][0]["index"]
    too_big = pod("q", container("a", mem=10), container("b", mem=10))
    result = verbs.filter_nodes(cache, args(too_big, "n1"))
    assert result["failedNodes"]["n1"].startswith("container a: no GPU with 10 GiB free")


def test_assumed_pod_holds_capacity_until_bind_fails() -> None:
    cache = make_cache(node("n1", gpus=1))
    binder = FakeBinder()
    binder.fail_bind = RuntimeError("409 Conflict")
    extender = Extender(cache, binder)
    the_pod = pod("p", container(mem=16))
    assert extender.filter(args(the_pod, "n1"))["nodenames"] == ["n1"]
    answer = extender.bind(
        {"podName": "p", "podNamespace": "default", "podUID": "uid-default-p", "node": "n1"}
    )
    assert "409 Conflict" in answer["error"]
    assert cache.pods == {}
    assert "default/p" not in binder.annotations and "default/p" not in binder.bound
    assert extender.filter(args(the_pod, "n1"))["nodenames"] == ["n1"]


def test_two_binds_in_flight_do_not_share_capacity() -> None:
    cache = make_cache(node("n1", gpus=1))
    first, second = pod("a", container(mem=10)), pod("b", container(mem=10))
    for the_pod in (first, second):
        assert verbs.filter_nodes(cache, args(the_pod, "n1"))["nodenames"] == ["n1"]
    verbs.decide_bind(cache, verbs.BindArgs("a", "default", "uid-default-a", "n1"))
    with pytest.raises(verbs.BindError, match="no GPU with 10 GiB free"):
        verbs.decide_bind(cache, verbs.BindArgs("b", "default", "uid-default-b", "n1"))


def test_rebuilt_from_annotations_and_released_when_pods_end() -> None:
    cache = make_cache(node("n1", gpus=1))
    placed = bound(cache, FakeBinder(), pod("p", container(mem=12)), "n1")
    fresh = make_cache(node("n1", gpus=1))
    fresh.replace_pods([placed])
    assert int(fresh.ledger.gpu_free_memory_mib[0, 0]) == 4 * GIB
    placed["status"]["phase"] = "Succeeded"
    fresh.upsert_pod(placed)
    assert int(fresh.ledger.gpu_free_memory_mib[0, 0]) == 16 * GIB
    fresh.replace_pods([placed | {"status": {"phase": "Running"}}])
    assert int(fresh.ledger.gpu_free_memory_mib[0, 0]) == 4 * GIB
    fresh.delete_pod(placed)
    assert int(fresh.ledger.gpu_free_memory_mib[0, 0]) == 16 * GIB


def test_watch_confirmation_of_our_bind_does_not_double_count() -> None:
    cache = make_cache(node("n1", gpus=1))
    placed = bound(cache, FakeBinder(), pod("p", container(mem=12)), "n1")
    cache.upsert_pod(placed)
    assert int(cache.ledger.gpu_free_memory_mib[0, 0]) == 4 * GIB
    assert not cache.pods["default/p"].assumed


def test_unhealthy_gpu_takes_no_new_shares_but_keeps_old_ones() -> None:
    cache = make_cache(node("n1", gpus=2))
    binder = FakeBinder()
    first = shares(bound(cache, binder, pod("a", container(mem=4)), "n1"))["main"][0]
    assert first["index"] == 0
    cache.upsert_node(node("n1", gpus=2, unhealthy=(0,)))
    assert int(cache.ledger.gpu_free_memory_mib[0, 0]) == 12 * GIB  # still counted
    second = shares(bound(cache, binder, pod("b", container(mem=4)), "n1"))["main"][0]
    assert second["index"] == 1


def test_prioritize_prefers_the_fuller_node_under_binpack() -> None:
    cache = make_cache(node("n1"), node("n2"))
    bound(cache, FakeBinder(), pod("a", container(mem=8)), "n2")
    scores = verbs.prioritize(cache, args(pod("b", container(mem=4)), "n1", "n2"))
    assert scores == [{"host": "n1", "score": 0}, {"host": "n2", "score": 10}]


def test_bind_of_unknown_pod_is_an_error() -> None:
    extender = Extender(make_cache(), FakeBinder())
    answer = extender.bind({"podName": "p", "podNamespace": "d", "podUID": "u", "node": "n1"})
    assert answer["error"].startswith("pod d/p: ")  # the API server does not know it either


def test_fragmentation_aware_policies_place_against_the_workload_seen() -> None:
    cache = make_cache(node("n1", gpus=2), node("n2", gpus=2))
    binder = FakeBinder()
    fgd = {protocol.ANNOTATION_POLICY: "fgd-pack"}
    for i in range(4):
        placed = bound(cache, binder, pod(f"p{i}", container(mem=8), annotations=fgd), "n1")
        assert shares(placed)["main"][0]["memoryMiB"] == 8 * GIB
    workload = cache.target_workload()
    assert [(s.gpu_count, s.memory_mib_per_gpu) for s in workload.shapes] == [(1, 8 * GIB)]
    # Four 8 GiB pods fill n1's two 16 GiB GPUs exactly: nothing stranded, n2 untouched.
    assert cache.ledger.gpu_free_memory_mib.tolist() == [[0, 0], [16 * GIB, 16 * GIB]]


def test_workload_is_learnt_from_bound_pods_after_a_restart_and_refreshed() -> None:
    cache = make_cache(node("n1", gpus=2))
    placed = [bound(cache, FakeBinder(), pod(f"p{i}", container(mem=2)), "n1") for i in range(4)]
    fresh = make_cache(node("n1", gpus=2))
    fresh.replace_pods(placed)
    assert [s.memory_mib_per_gpu for s in fresh.target_workload().shapes] == [2 * GIB]
    for i in range(30):  # enough new pods to refresh: 6 GiB becomes the main shape
        fresh.pod_request(pod(f"q{i}", container(mem=6)))
    assert fresh.target_workload().shapes[0].memory_mib_per_gpu == 6 * GIB
    assert fresh.target_workload().weights[0] == pytest.approx(30 / 34)


def test_compat_aliyun_bind_writes_both_sets_of_annotations() -> None:
    cache = ClusterCache(Units(compat_aliyun=True))
    cache.replace_nodes([node("n1", gpus=2, memory_gib=16)])
    cache.replace_pods([])
    binder = FakeBinder()
    limits = {protocol.ALIYUN_RESOURCE_GPU_MEMORY: "5"}
    old_style = pod("old", {"name": "main", "resources": {"limits": limits}})
    written = bound(cache, binder, old_style, "n1")["metadata"]["annotations"]
    (share,) = shares(old_style)["main"]
    assert share["memoryMiB"] == 5 * GIB
    assert written[protocol.ALIYUN_ANNOTATION_GPU_INDEX] == str(share["index"])
    assert written[protocol.ALIYUN_ANNOTATION_POD_MEMORY] == "5"
    assert written[protocol.ALIYUN_ANNOTATION_DEV_MEMORY] == "16"
    assert written[protocol.ALIYUN_ANNOTATION_ASSIGNED] == "false"
    assert (
        written[protocol.ALIYUN_ANNOTATION_ASSUME_TIME] == written[protocol.ANNOTATION_ASSUME_TIME]
    )
    # Without the setting the same pod is refused on every node, with the reason.
    plain = make_cache(node("n1"))
    result = verbs.filter_nodes(plain, args(pod("old2", old_style["spec"]["containers"][0]), "n1"))
    assert "--compat-aliyun" in result["failedAndUnresolvableNodes"]["n1"]
    # Our own pods get no Alibaba annotations without the setting.
    ours = bound(plain, FakeBinder(), pod("new", container(mem=2)), "n1")
    assert protocol.ALIYUN_ANNOTATION_GPU_INDEX not in ours["metadata"]["annotations"]


def test_prioritize_scores_only_the_nodes_that_fit_and_zero_for_the_rest() -> None:
    cache = make_cache(
        node("small", memory_gib=16), node("big", memory_gib=80), node("big2", memory_gib=80)
    )
    ranked = verbs.prioritize(cache, args(pod("p", container(mem=40)), "small", "big", "big2"))
    scores = {item["host"]: item["score"] for item in ranked}
    assert scores["small"] == 0 and scores["big"] == scores["big2"] == verbs.MAX_EXTENDER_PRIORITY


def _free_gib(cache: ClusterCache, node_index: int = 0, gpu: int = 0) -> float:
    return int(cache.ledger.gpu_free_memory_mib[node_index, gpu]) / GIB


def _rebuilt(cache_nodes: list[dict], placed: dict) -> ClusterCache:
    fresh = ClusterCache()
    fresh.replace_nodes(cache_nodes)
    fresh.replace_pods([placed])
    return fresh


def test_init_container_reuses_the_app_share_it_runs_before() -> None:
    # 10 GiB app + 8 GiB init on one 16 GiB GPU: they never run together (max rule).
    nodes = [node("n1", gpus=1)]
    cache = make_cache(*nodes)
    the_pod = pod("p", container("app", mem=10), init=(container("setup", mem=8),))
    placed = bound(cache, FakeBinder(), the_pod, "n1")
    assert shares(placed)["setup"] == [
        {"uuid": "GPU-n1-0", "index": 0, "memoryMiB": 8 * GIB, "core": 0}
    ]
    assert _free_gib(cache) == 6
    assert _free_gib(_rebuilt(nodes, placed)) == 6  # the same charge after a restart
    cache.delete_pod(placed)
    assert _free_gib(cache) == 16


def test_init_container_larger_than_the_apps_holds_the_difference() -> None:
    nodes = [node("n1", gpus=1)]
    cache = make_cache(*nodes)
    the_pod = pod("p", container("app", mem=4), init=(container("setup", mem=12),))
    placed = bound(cache, FakeBinder(), the_pod, "n1")
    assert _free_gib(cache) == 4  # max(12, 4), not 16
    held = {allocation.request_name for allocation in cache.ledger.allocations()}
    assert held == {"default/p/app", "default/p/(init)"}
    assert _free_gib(_rebuilt(nodes, placed)) == 4
    cache.delete_pod(placed)
    assert _free_gib(cache) == 16 and not cache.ledger.allocations()


def test_sidecar_init_container_runs_beside_the_apps_and_adds_up() -> None:
    cache = make_cache(node("n1", gpus=1))
    sidecar = container("proxy", mem=8) | {"restartPolicy": "Always"}
    the_pod = pod("p", container("app", mem=10), init=(sidecar,))
    result = verbs.filter_nodes(cache, args(the_pod, "n1"))
    assert result["nodenames"] == []
    assert result["failedNodes"]["n1"].startswith("container app: no GPU with 10 GiB free")


def test_exclusive_init_container_beside_a_shared_app_keeps_others_off_that_gpu() -> None:
    nodes = [node("n1", gpus=2)]
    cache = make_cache(*nodes)
    binder = FakeBinder()
    the_pod = pod("p", container("app", mem=4), init=(container("setup", gpu=1),))
    placed = bound(cache, binder, the_pod, "n1")
    app_gpu = shares(placed)["app"][0]["index"]
    init_share = shares(placed)["setup"][0]
    assert init_share["exclusive"] and init_share["memoryMiB"] == 16 * GIB
    if init_share["index"] == app_gpu:
        # The rest of that GPU is held while the init container may run.
        assert _free_gib(cache, 0, app_gpu) == 0
    other = shares(bound(cache, binder, pod("q", container(mem=1)), "n1"))["main"][0]
    assert other["index"] != init_share["index"]
    rebuilt = _rebuilt(nodes, placed)  # without q
    for index in range(2):
        assert _free_gib(rebuilt, 0, index) == _free_gib(cache, 0, index) + (
            1 if index == other["index"] else 0
        )


def test_candidate_limit_passes_only_the_policys_best_nodes() -> None:
    cache = make_cache(node("n1"), node("n2"), node("n3"))
    binder = FakeBinder()
    bound(cache, binder, pod("a", container(mem=8)), "n2")
    bound(cache, binder, pod("b", container(mem=4)), "n3")
    body = args(pod("c", container(mem=2)), "n1", "n2", "n3")
    assert verbs.filter_nodes(cache, body)["nodenames"] == ["n1", "n2", "n3"]
    assert verbs.filter_nodes(cache, body, candidate_limit=1)["nodenames"] == ["n2"]  # binpack
    assert verbs.filter_nodes(cache, body, candidate_limit=2)["nodenames"] == ["n2", "n3"]
    assert verbs.filter_nodes(cache, body, candidate_limit=5)["nodenames"] == ["n1", "n2", "n3"]


def _with_spec(the_pod: dict, **spec: object) -> dict:
    the_pod["spec"].update(spec)
    return the_pod


PREFERRED_NODE = {
    "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 10,
                "preference": {
                    "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                },
            }
        ]
    }
}
PREFERRED_POD = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 1,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "x"}},
                },
            }
        ]
    }
}
SPREAD = {"maxSkew": 1, "topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "x"}}}


@pytest.mark.parametrize(
    ("spec", "soft"),
    [
        ({}, False),
        ({"affinity": PREFERRED_NODE}, True),
        ({"affinity": PREFERRED_POD}, True),
        ({"topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "ScheduleAnyway"}]}, True),
        # Hard rules are kube-scheduler's filters, applied before the extender is asked.
        ({"topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "DoNotSchedule"}]}, False),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
                    }
                }
            },
            False,
        ),
    ],
)
def test_auto_candidates_pass_the_best_node_unless_the_pod_has_soft_preferences(
    spec: dict, soft: bool
) -> None:
    cache = make_cache(node("n1"), node("n2"), node("n3"))
    binder = FakeBinder()
    bound(cache, binder, pod("a", container(mem=8)), "n2")
    bound(cache, binder, pod("b", container(mem=4)), "n3")
    body = args(_with_spec(pod("c", container(mem=2)), **spec), "n1", "n2", "n3")
    passed = verbs.filter_nodes(cache, body, candidate_limit=verbs.AUTO_CANDIDATES)
    # Without soft preferences only binpack's choice passes: kube-scheduler, left with one
    # feasible node, skips its scoring and prioritize. With them, all for it to weigh.
    assert passed["nodenames"] == (["n1", "n2", "n3"] if soft else ["n2"])
    # The extender's default is auto.
    assert Extender(cache, binder).filter(body)["nodenames"] == passed["nodenames"]


def test_auto_candidate_is_the_one_a_bind_would_choose_for_each_policy() -> None:
    for policy, expected in (("binpack", "n2"), ("spread", "n1")):
        cache = make_cache(node("n1", policy=policy), node("n2", policy=policy))
        binder = FakeBinder()
        bound(cache, binder, pod("a", container(mem=8)), "n2")
        body = args(pod("c", container(mem=2)), "n1", "n2")
        assert verbs.filter_nodes(cache, body, None)["nodenames"] == [expected], policy


def test_the_one_candidate_is_the_best_node_not_one_of_a_rounded_tie() -> None:
    # prioritize's 0..10 would give the two fullest nodes 10 each; the candidate is ranked
    # unrounded, so binpack picks the fullest even when kube-scheduler lists the other first.
    cache = make_cache(*(node(name, gpus=1, memory_gib=80) for name in ("n0", "n1", "n2")))
    binder = FakeBinder()
    bound(cache, binder, pod("a", container(mem=78)), "n1")
    bound(cache, binder, pod("b", container(mem=79)), "n2")
    body = args(pod("c", container(mem=1)), "n0", "n1", "n2")
    levels = {item["host"]: item["score"] for item in verbs.prioritize(cache, body)}
    assert levels["n1"] == levels["n2"] == verbs.MAX_EXTENDER_PRIORITY
    assert verbs.filter_nodes(cache, body, None)["nodenames"] == ["n2"]


def test_node_updates_that_change_no_gpushare_input_leave_the_ledger_alone() -> None:
    cache = make_cache(node("n1"), node("n2"))
    binder = FakeBinder()
    bound(cache, binder, pod("a", container(mem=8)), "n1")
    ledger = cache.ledger
    cordoned = node("n1")
    cordoned["spec"] = {"unschedulable": True}
    cordoned["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    cache.upsert_node(cordoned)
    assert cache.ledger is ledger  # not rebuilt: nothing the extender reads changed
    cache.upsert_node(node("n1", unhealthy=(0,)))  # the inventory changed
    assert cache.ledger is not ledger
    assert not cache.ledger.gpu_healthy[cache.ledger.node_index["n1"], 0]
    assert cache.pods["default/a"].in_ledger  # its share still counted after the rebuild


def test_two_pods_whose_gpus_are_swapped_one_after_the_other_are_both_counted() -> None:
    # The device plugin corrects a swap by rewriting two annotations, one after the other; in
    # between both name GPU 1, which cannot hold both: the first waits aside, then counts.
    cache = make_cache(node("n1", gpus=2))
    binder = FakeBinder()
    x = bound(cache, binder, pod("x", container(mem=10)), "n1")
    y = bound(cache, binder, pod("y", container(mem=10)), "n1")
    gpus = {shares(x)["main"][0]["index"], shares(y)["main"][0]["index"]}
    assert gpus == {0, 1}

    def moved(the_pod: dict, to: dict) -> dict:
        the_pod = json.loads(json.dumps(the_pod))
        the_pod["metadata"]["annotations"][protocol.ANNOTATION_ALLOCATION] = to["metadata"][
            "annotations"
        ][protocol.ANNOTATION_ALLOCATION]
        return the_pod

    new_x, new_y = moved(x, y), moved(y, x)
    cache.upsert_pod(new_x)
    assert not cache.pods["default/x"].in_ledger  # its new GPU still holds y's share
    cache.upsert_pod(new_y)
    assert cache.pods["default/x"].in_ledger and cache.pods["default/y"].in_ledger
    assert cache.ledger.gpu_free_memory_mib.tolist() == [[6 * GIB, 6 * GIB]]
