"""The capacity nudge: a node annotation after the cache frees a share while a pod waits."""

from __future__ import annotations

from extender_helpers import FakeBinder, args, container, node, pod

from gpushare import protocol
from gpushare.extender.cache import ClusterCache
from gpushare.extender.nudge import REFUSAL_MEMORY_S, CapacityNudger
from gpushare.extender.server import Extender


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setup(is_leader=None) -> tuple[ClusterCache, Extender, CapacityNudger, list, Clock]:
    cache = ClusterCache()
    cache.replace_nodes([node("n1", gpus=1)])
    cache.replace_pods([])
    written: list[tuple[str, dict[str, str]]] = []
    clock = Clock()
    nudger = CapacityNudger(lambda name, notes: written.append((name, notes)), is_leader, clock)
    cache.on_freed = nudger.freed
    return cache, Extender(cache, FakeBinder(), None, nudger), nudger, written, clock


def _bind(extender: Extender, the_pod: dict) -> dict:
    assert extender.filter(args(the_pod, "n1"))["nodenames"] == ["n1"]
    meta = the_pod["metadata"]
    answer = extender.bind(
        {"podName": meta["name"], "podNamespace": "default", "podUID": meta["uid"], "node": "n1"}
    )
    assert answer == {}
    the_pod["metadata"]["annotations"].update(
        extender.binder.annotations[f"default/{meta['name']}"]
    )
    the_pod["spec"]["nodeName"] = "n1"
    return the_pod


def test_freed_share_with_a_refused_pod_waiting_annotates_the_node() -> None:
    cache, extender, nudger, written, _ = setup()
    placed = _bind(extender, pod("big", container(mem=12)))
    refused = extender.filter(args(pod("waiting", container(mem=8)), "n1"))
    assert refused["nodenames"] == [] and refused["failedNodes"]
    cache.delete_pod(placed)
    nudger.flush()
    assert [name for name, _ in written] == ["n1"]
    assert int(written[0][1][protocol.ANNOTATION_CAPACITY_FREED]) > 0
    assert nudger.nudges == 1


def test_nothing_is_written_when_no_pod_waits_or_the_refusal_is_old() -> None:
    cache, extender, nudger, written, clock = setup()
    cache.delete_pod(_bind(extender, pod("a", container(mem=4))))
    nudger.flush()
    assert written == []
    extender.filter(args(pod("huge", container(mem=100)), "n1"))  # can never fit: no wait
    cache.delete_pod(_bind(extender, pod("b", container(mem=4))))
    nudger.flush()
    assert written == []
    placed = _bind(extender, pod("c", container(mem=12)))
    extender.filter(args(pod("d", container(mem=8)), "n1"))
    clock.now += REFUSAL_MEMORY_S + 1  # kube-scheduler has flushed its unschedulable pods
    cache.delete_pod(placed)
    nudger.flush()
    assert written == []


def test_a_follower_does_not_write() -> None:
    cache, extender, nudger, written, _ = setup(is_leader=lambda: False)
    nudger.refused()
    cache.delete_pod(_bind(extender, pod("a", container(mem=4))))
    nudger.flush()
    assert written == []
