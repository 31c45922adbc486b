"""The extender's verbs as functions of the cache: filter, prioritize and the bind decision.

JSON shapes are those of k8s.io/kube-scheduler/extender/v1 in node-cache-capable mode:
ExtenderArgs ``{"pod": {...}, "nodenames": [...]}`` (a full ``"nodes"`` list is accepted
too), ExtenderFilterResult ``{"nodenames", "failedNodes", "failedAndUnresolvableNodes",
"error"}``, HostPriorityList ``[{"host", "score"}]`` with scores 0..10 (MaxExtenderPriority),
ExtenderBindingArgs ``{"podName", "podNamespace", "podUID", "node"}`` and
ExtenderBindingResult ``{"error"}``.

kube-scheduler groups the per-node reasons of failedNodes into its FailedScheduling event
("0/4 nodes are available: 4 no GPU with 200 GiB free (largest free: 141 GiB on GPU 0)."),
so each reason is one of the engine's short phrases. Nodes that could never take the pod,
even empty, go to failedAndUnresolvableNodes so that preemption is not tried for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from gpushare import protocol
from gpushare.extender.cache import ClusterCache
from gpushare.extender.requests import ContainerRequest, PodRequest, RequestError
from gpushare.model import Allocation, CapacityError, Request
from gpushare.model.charges import INIT_CHARGE_NAME, init_excess
from gpushare.placement.engine import NoFit, Placer
from gpushare.placement.policies import PolicyError

MAX_EXTENDER_PRIORITY = 10


class VerbError(ValueError):
    """A request body that is not what the verb takes (the server answers 400)."""


def _field(body: Any, *names: str) -> Any:
    if not isinstance(body, dict):
        raise VerbError("expected a JSON object")
    for name in names:
        if name in body:
            return body[name]
    return None


def _args(body: Any) -> tuple[dict[str, Any], list[str]]:
    pod = _field(body, "pod", "Pod")
    if not isinstance(pod, dict):
        raise VerbError("ExtenderArgs: pod must be an object")
    names = _field(body, "nodenames", "NodeNames")
    if names is None:
        nodes = _field(body, "nodes", "Nodes") or {}
        items = nodes.get("items") if isinstance(nodes, dict) else None
        names = [((n or {}).get("metadata") or {}).get("name") for n in items or []]
    # set(map(type, ...)) runs in C: a per-name Python check costs 0.2 ms for 1000 nodes.
    if not isinstance(names, list) or not set(map(type, names)) <= {str}:
        raise VerbError("ExtenderArgs: nodenames must be a list of strings")
    return pod, names


def _indices(cache: ClusterCache, names: list[str]) -> np.ndarray:
    """Each name's node index in the ledger, -1 for a node gpushare does not use."""
    found = map(cache.ledger.node_index.get, names, repeat(-1))  # in C: no per-name bytecode
    return np.fromiter(found, dtype=np.int64, count=len(names))


def filter_args(body: Any) -> tuple[dict[str, Any], list[str]]:
    """The pod and node names of an ExtenderArgs body; VerbError if it is not one."""
    return _args(body)


def _policy(cache: ClusterCache, pod: PodRequest, node: str) -> str:
    if pod.policy:
        return pod.policy
    info = cache.nodes.get(node)
    return info.policy if info is not None else protocol.DEFAULT_NODE_POLICY


def _never_fits(placer: Placer, request: Request, index: int | slice = slice(None)) -> Any:
    """True if the node could not take the request even with nothing on it (for every node
    of the ledger at once, as a mask, without ``index``)."""
    ledger = placer.ledger
    present = ledger.gpu_present[index]
    if request.allowed_models:
        allowed = np.array([m in request.allowed_models for m in ledger.models] + [False])
        present = present & allowed[ledger.gpu_model_id[index]]
    if not request.exclusive:
        present = present & (ledger.gpu_memory_mib[index] >= request.memory_mib_per_gpu)
    counts = present.sum(axis=-1)
    if isinstance(index, slice):
        return counts < request.gpu_count
    return int(counts) < request.gpu_count


def _unusable_reason(cache: ClusterCache, name: str) -> str:
    info = cache.nodes.get(name)
    if info is None:
        return "node not known to gpushare"
    return f"gpushare not usable: {info.problem}"


@dataclass(slots=True)
class PodPlacement:
    """A pod placed on one node: each GPU container's allocation and the ledger's charges."""

    containers: dict[str, Allocation]
    charges: dict[str, Allocation]


def _try_on_node(
    placer: Placer, pod: PodRequest, index: int, keep: bool
) -> tuple[PodPlacement | None, str | None, bool]:
    """Place every GPU container of the pod on one node: app containers, then init ones.

    Each regular init container is decided with the pod's own shares set aside, since it
    runs before them and may reuse their capacity; the ledger then holds only what it needs
    beyond them (model/charges.py). Returns the placement (its charges reserved in the
    ledger when ``keep``), or the first failing container's reason and whether it can never
    fit there. Without ``keep`` nothing stays reserved; with it, nothing on failure.
    """
    ledger = placer.ledger
    candidates = np.array([index])
    node = ledger.nodes[index].name
    apps: dict[str, Allocation] = {}
    inits: dict[str, Allocation] = {}
    reserved: list[str] = []  # ledger names currently held for this pod

    def release_all() -> None:
        for name in reserved:
            ledger.release(name)
        reserved.clear()

    def reserve(allocations: list[Allocation]) -> None:
        for allocation in allocations:
            ledger.reserve(allocation)
            reserved.append(allocation.request_name)

    def no_fit(item: ContainerRequest) -> tuple[None, str, bool]:
        reason = placer.reason(item.request, index) or "does not fit"
        if len(pod.containers) > 1:
            reason = f"container {item.container}: {reason}"
        return None, reason, _never_fits(placer, item.request, index)

    try:
        for item in pod.containers:
            if item.init:
                continue
            decision = placer.decide(item.request, candidates)
            if isinstance(decision, NoFit):
                return no_fit(item)
            reserve([decision.allocation])
            apps[item.container] = decision.allocation
        excess: Allocation | None = None
        for item in pod.containers:
            if not item.init:
                continue
            release_all()
            decision = placer.decide(item.request, candidates)
            reserve(list(apps.values()) + ([excess] if excess is not None else []))
            if isinstance(decision, NoFit):
                return no_fit(item)
            inits[item.container] = decision.allocation
            if excess is not None:
                ledger.release(excess.request_name)
                reserved.remove(excess.request_name)
            excess = init_excess(pod.key, node, apps, inits)
            if excess is not None:
                reserve([excess])
        charges: dict[str, Allocation] = dict(apps)
        if excess is not None:
            charges[INIT_CHARGE_NAME] = excess
        placement = PodPlacement({**apps, **inits}, charges)
        if keep:
            reserved.clear()
        return placement, None, False
    finally:
        release_all()


# filter_nodes' candidate_limit: one node for a pod without soft preferences, all for one with.
AUTO_CANDIDATES = None


def candidates_for(request: PodRequest, candidate_limit: int | None) -> int:
    """How many of the nodes that fit filter passes (0: all).

    Auto: a pod without soft preferences gets only the node its GPU policy ranks first.
    kube-scheduler, left with one feasible node, then skips its score plugins and the
    prioritize call, so the GPU policy alone chooses the node, in one HTTP call instead of
    two. A pod with soft preferences gets every node that fits, for kube-scheduler to weigh
    them with prioritize's GPU score.
    """
    if candidate_limit is not None:
        return candidate_limit
    return 0 if request.soft_preferences else 1


def filter_nodes(cache: ClusterCache, body: Any, candidate_limit: int | None = 0) -> dict[str, Any]:
    """Filter's answer; with a ``candidate_limit`` (None: auto, see candidates_for) only
    that many of the nodes that fit pass, those the pod's GPU policy scores highest."""
    pod, names = _args(body)
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    try:
        request = cache.pod_request(pod)
    except RequestError as error:
        return {
            "nodenames": [],
            "failedNodes": {},
            "failedAndUnresolvableNodes": dict.fromkeys(names, str(error)),
        }
    if not request.uses_gpu:
        return {"nodenames": names, "failedNodes": {}}
    with cache.lock:
        try:
            placer = cache.placer(request.policy or protocol.DEFAULT_NODE_POLICY)
        except PolicyError as error:
            return {
                "nodenames": [],
                "failedNodes": {},
                "failedAndUnresolvableNodes": dict.fromkeys(names, str(error)),
            }
        indices = _indices(cache, names)
        known = indices >= 0
        limit = candidates_for(request, candidate_limit)
        if len(request.containers) == 1:
            only = request.containers[0].request
            fits, eligible = placer.feasible(only)
            ok = known.copy()
            ok[known] = fits[indices[known]]
            positions = np.flatnonzero(ok)
            if limit and len(positions) > limit:
                # Rank the nodes that fit by their policy, with the eligible GPUs just
                # computed (they depend on the ledger and the request, not on the policy).
                scores = _node_scores(cache, request, indices[positions], {only: eligible})
                positions = _top(positions, scores, limit)
                limit = 0
            passed = [names[i] for i in positions.tolist()]
            # Reasons only when no node fits: kube-scheduler shows them (FailedScheduling)
            # and weighs them (preemption) only for a pod that fits nowhere; when some node
            # passes it drops the others, with or without a reason. A Python call per
            # failing node is the slow part of filter on a full cluster.
            failing = np.flatnonzero(~ok) if len(positions) == 0 else np.empty(0, np.int64)
            never = _never_fits(placer, only).tolist() if len(failing) else []
            for position in failing.tolist():
                name, index = names[position], int(indices[position])
                if index < 0:
                    unresolvable[name] = _unusable_reason(cache, name)
                    continue
                reason = placer.reason(only, index, eligible) or "does not fit"
                (unresolvable if never[index] else failed)[name] = reason
        else:
            for name, index in zip(names, indices.tolist(), strict=True):
                if index < 0:
                    unresolvable[name] = _unusable_reason(cache, name)
                    continue
                _, reason, never = _try_on_node(placer, request, index, keep=False)
                if reason is None:
                    passed.append(name)
                    continue
                (unresolvable if never else failed)[name] = reason
    if limit:
        passed = best_candidates(cache, request, passed, limit)
    result: dict[str, Any] = {"nodenames": passed, "failedNodes": failed}
    if unresolvable:
        result["failedAndUnresolvableNodes"] = unresolvable
    return result


def no_fit_message(result: dict[str, Any]) -> str:
    """kube-scheduler's grouping of a filter result's reasons, for logs and tests."""
    reasons = {**result.get("failedNodes", {}), **result.get("failedAndUnresolvableNodes", {})}
    counts: dict[str, int] = {}
    for reason in reasons.values():
        counts[reason] = counts.get(reason, 0) + 1
    total = len(reasons) + len(result.get("nodenames", []))
    return NoFit(counts, total).message()


def prioritize(cache: ClusterCache, body: Any) -> list[dict[str, Any]]:
    pod, names = _args(body)
    try:
        request = cache.pod_request(pod)
    except RequestError:
        return [{"host": name, "score": 0} for name in names]
    if not request.uses_gpu:
        return [{"host": name, "score": 0} for name in names]
    with cache.lock:
        scores = _node_scores(cache, request, _indices(cache, names))
    levels = np.rint(scores * MAX_EXTENDER_PRIORITY).astype(np.int64)
    return [
        {"host": name, "score": score} for name, score in zip(names, levels.tolist(), strict=True)
    ]


def _node_scores(
    cache: ClusterCache,
    request: PodRequest,
    indices: np.ndarray,
    known_eligible: dict[Request, np.ndarray] | None = None,
) -> np.ndarray:
    """Each node's score by its policy (the pod's, else its label), scaled to 0..1 among the
    nodes of that policy (1: the best; prioritize rounds it to 0..10, and the candidates are
    ranked by it unrounded); 0 where it does not fit or is not a gpushare node (index -1).
    ``known_eligible``: each request's eligible_gpus, when the caller has them and every node
    of ``indices`` is known to fit. Call with the cache's lock held."""
    scores = np.zeros(len(indices))
    positions = np.flatnonzero(indices >= 0)
    if request.policy:
        groups = {request.policy: positions}
    else:
        # Nodes by their policy label: usually one group, the default.
        policy_ids = cache.node_policy_ids()[indices[positions]]
        groups = {
            cache.policy_names[policy_id]: positions[policy_ids == policy_id]
            for policy_id in np.unique(policy_ids).tolist()
        }
    for policy, chosen in groups.items():
        try:
            placer = cache.placer(policy)
        except PolicyError:
            continue
        nodes = indices[chosen]
        feasible = np.ones(len(nodes), dtype=bool)
        eligible: dict[Request, np.ndarray] = {}
        for item in request.containers:
            known = known_eligible.get(item.request) if known_eligible else None
            if known is None:
                fits, known = placer.feasible(item.request)
                feasible &= fits[nodes]
            eligible[item.request] = known
        if not feasible.any():
            continue
        nodes, chosen = nodes[feasible], chosen[feasible]
        total = np.zeros(len(nodes))
        for item in request.containers:
            total += placer.scores(item.request, nodes, eligible[item.request])
        low, high = float(total.min()), float(total.max())
        scores[chosen] = 1.0 if high - low < 1e-12 else (total - low) / (high - low)
    return scores


def best_candidates(
    cache: ClusterCache, request: PodRequest, passed: list[str], limit: int
) -> list[str]:
    """The ``limit`` nodes of ``passed`` that the pod's GPU policy scores highest, in their
    original order; all of them when there are no more than ``limit``."""
    if limit <= 0 or len(passed) <= limit:
        return passed
    with cache.lock:
        scores = _node_scores(cache, request, _indices(cache, passed))
    keep = _top(np.arange(len(passed)), scores, limit)
    return [passed[i] for i in keep.tolist()]


def _top(positions: np.ndarray, scores: np.ndarray, limit: int) -> np.ndarray:
    """The ``limit`` positions with the highest scores, in their original order; among
    equal scores, the earlier (kube-scheduler's order: a stable sort)."""
    if limit == 1:
        return positions[[int(np.argmax(scores))]]  # argmax: the first of the highest
    return positions[np.sort(np.argsort(-scores, kind="stable")[:limit])]


@dataclass(frozen=True, slots=True)
class BindArgs:
    name: str
    namespace: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def bind_args(body: Any) -> BindArgs:
    values = [
        _field(body, "podName", "PodName"),
        _field(body, "podNamespace", "PodNamespace"),
        _field(body, "podUID", "PodUID"),
        _field(body, "node", "Node"),
    ]
    if not all(isinstance(v, str) for v in values) or not values[0] or not values[3]:
        raise VerbError("ExtenderBindingArgs: podName, podNamespace, podUID and node are needed")
    return BindArgs(*values)


class BindError(RuntimeError):
    """A bind that cannot go ahead; the message goes to kube-scheduler as the result's error."""


def decide_bind(
    cache: ClusterCache,
    args: BindArgs,
    fetch_pod: Callable[[str, str], dict[str, Any]] | None = None,
) -> tuple[dict[str, Allocation], dict[str, str]]:
    """Choose the GPUs for the pod on ``args.node`` and assume them in the cache.

    Returns the allocations and the annotations to write. The caller writes them, creates
    the Binding, and on any failure calls ``cache.forget(args.key, args.uid)``.
    """
    remembered = cache.remembered_request(args.uid)
    if remembered is None:
        if fetch_pod is None:
            raise BindError(f"pod {args.key}: not seen by filter; cannot bind it")
        try:
            remembered = cache.pod_request(fetch_pod(args.namespace, args.name))
        except RequestError as error:
            remembered = error
    if isinstance(remembered, RequestError):
        raise BindError(f"pod {args.key}: {remembered}")
    request = remembered
    with cache.lock:
        cache.release_pod(args.key)  # a retried bind: what an earlier try assumed goes back
        index = cache.ledger.node_index.get(args.node)
        if index is None:
            raise BindError(f"node {args.node}: {_unusable_reason(cache, args.node)}")
        try:
            placer = cache.placer(_policy(cache, request, args.node))
        except PolicyError as error:
            raise BindError(str(error)) from None
        try:
            placement, reason, _ = _try_on_node(placer, request, index, keep=True)
        except CapacityError as error:
            raise BindError(f"node {args.node}: {error}") from None
        if placement is None:
            raise BindError(f"node {args.node}: {reason}")
        cache.assume(args.key, args.uid, args.node, placement.charges)
        allocations = placement.containers
        node_info = cache.nodes.get(args.node)
        gpus = node_info.node.gpus if node_info is not None and node_info.node else ()
    assume_time = str(time.time_ns())
    shares = {
        container: [
            protocol.ShareInfo(s.uuid, s.index, s.memory_mib, s.core_percent, s.exclusive)
            for s in allocation.gpu_shares
        ]
        for container, allocation in allocations.items()
    }
    annotations = {
        protocol.ANNOTATION_ALLOCATION: protocol.encode_allocation(shares),
        protocol.ANNOTATION_ASSUME_TIME: assume_time,
        protocol.ANNOTATION_PHASE: protocol.PHASE_ASSUMED,
    }
    if cache.units.compat_aliyun:
        annotations.update(aliyun_annotations(allocations, gpus, assume_time))
    return allocations, annotations


def aliyun_annotations(
    allocations: dict[str, Allocation], gpus: Any, assume_time: str
) -> dict[str, str]:
    """The annotations Alibaba gpushare's device plugin reads, for the same decision."""
    indices: list[int] = []
    total_mib = 0
    for allocation in allocations.values():
        for share in allocation.gpu_shares:
            if share.index not in indices:
                indices.append(share.index)
            total_mib += share.memory_mib
    memory = {gpu.index: gpu.memory_mib for gpu in gpus}
    return {
        protocol.ALIYUN_ANNOTATION_GPU_INDEX: ",".join(map(str, indices)),
        protocol.ALIYUN_ANNOTATION_POD_MEMORY: str(total_mib // protocol.MIB_PER_GIB),
        protocol.ALIYUN_ANNOTATION_DEV_MEMORY: str(
            memory.get(indices[0], 0) // protocol.MIB_PER_GIB if indices else 0
        ),
        protocol.ALIYUN_ANNOTATION_ASSIGNED: "false",
        protocol.ALIYUN_ANNOTATION_ASSUME_TIME: assume_time,
    }
