"""The extender's view of the cluster: gpushare nodes, the pods holding GPU shares, a Ledger.

Fed by watches (watch.py) and by the extender's own binds. Nodes come from the
``gpushare.io/gpus`` annotation of nodes labelled ``gpushare.io/enabled=true``; pods count
once they are bound with a ``gpushare.io/allocation`` annotation, or from the moment this
extender assumes them in a bind (so that two binds in flight never get the same capacity)
until the bind fails. Pods that end (Succeeded/Failed) or are deleted release their shares.

When a node's inventory changes (a GPU added, removed or turned unhealthy) the Ledger is
rebuilt and every allocation re-entered; an allocation that no longer fits (its GPU is gone)
is kept aside and tried again at the next rebuild. An unhealthy GPU keeps its shares but
takes no new ones (the engine's filter skips it).

Every method takes the lock; callers that read the ledger across several calls (the verbs)
hold ``cache.lock`` themselves. Host CPU and memory are left to kube-scheduler: nodes enter
the ledger with none, and requests ask for none.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpushare import protocol
from gpushare.extender.requests import (
    PodRequest,
    RequestError,
    Units,
    parse_pod,
    pod_key,
    request_name,
)
from gpushare.model import Allocation, CapacityError, Gpu, GpuShare, Ledger, ModelError, Node
from gpushare.model.charges import INIT_CHARGE_NAME, pod_charges
from gpushare.placement.engine import Placer, resolve_policy
from gpushare.placement.fragmentation import Shape, TargetWorkload
from gpushare.placement.policies import PolicyError

log = logging.getLogger("gpushare.extender")


# What the cache reads of a node object: its enabled and policy labels and its inventory
# annotation. A node event that changes none of them (a status update, a cordon) changes
# nothing in the cache, and is not parsed again.
NodeSource = tuple[str | None, str | None, str | None]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    node: Node | None  # None: not a usable gpushare node (see ``problem``)
    policy: str
    problem: str | None
    source: NodeSource  # what it was made from (node_source)


@dataclass(slots=True)
class PodState:
    """What one pod holds on ``node``: its ledger entries (model/charges.py)."""

    key: str
    uid: str
    node: str
    allocations: dict[str, Allocation]  # charges: app containers, and "(init)" if any
    assumed: bool  # entered by our bind, not yet seen bound with its annotation
    in_ledger: bool = field(default=False)


def node_source(obj: dict[str, Any]) -> tuple[str, NodeSource]:
    """A node object's name, and what node_info reads of it."""
    metadata = obj.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    source = (
        labels.get(protocol.LABEL_ENABLED),
        labels.get(protocol.LABEL_POLICY),
        annotations.get(protocol.ANNOTATION_GPUS),
    )
    return str(metadata.get("name") or ""), source


def node_info(obj: dict[str, Any]) -> NodeInfo:
    """A node object as the cache sees it."""
    name, source = node_source(obj)
    enabled, policy_label, text = source
    policy = policy_label or protocol.DEFAULT_NODE_POLICY
    if enabled != "true":
        return NodeInfo(name, None, policy, f"{protocol.LABEL_ENABLED} is not true", source)
    if not text:
        return NodeInfo(name, None, policy, f"no {protocol.ANNOTATION_GPUS} annotation", source)
    try:
        gpus = protocol.decode_gpus(text)
        node = Node(
            name=name,
            gpus=tuple(
                Gpu(g.index, g.uuid, g.model, g.memory_mib, g.numa, g.healthy) for g in gpus
            ),
            cpu_milli=0,
            memory_mib=0,
        )
    except (protocol.ProtocolError, ModelError) as error:
        return NodeInfo(name, None, policy, f"bad {protocol.ANNOTATION_GPUS}: {error}", source)
    return NodeInfo(name, node, policy, None, source)


def allocations_from_pod(obj: dict[str, Any]) -> dict[str, Allocation] | None:
    """The ledger charges of the allocation a pod's annotation records (model/charges.py),
    or None if it records none (or a malformed one)."""
    metadata = obj.get("metadata") or {}
    text = (metadata.get("annotations") or {}).get(protocol.ANNOTATION_ALLOCATION)
    node = (obj.get("spec") or {}).get("nodeName")
    if not text or not node:
        return None
    key = pod_key(obj)
    try:
        decoded = protocol.decode_allocation(text)
    except protocol.ProtocolError as error:
        log.warning("pod %s: ignoring its allocation: %s", key, error)
        return None
    containers = {
        container: Allocation(
            request_name=request_name(key, container),
            node_name=node,
            cpu_milli=0,
            memory_mib=0,
            gpu_shares=tuple(
                GpuShare(s.uuid, s.index, s.memory_mib, s.core, s.exclusive) for s in shares
            ),
        )
        for container, shares in decoded.items()
    }
    return pod_charges(key, node, containers, protocol.regular_init_names(obj))


# The target workload of the fragmentation-aware policies (fgd, fgd-pack) is learnt from the
# GPU pods the extender has seen: the last WORKLOAD_HISTORY_PODS of them, bound or pending,
# ended or not (a workload's mix, not what runs now). It is refreshed when the pods seen since
# the last refresh reach WORKLOAD_REFRESH_FRACTION of the total (at least
# WORKLOAD_REFRESH_MIN_PODS), so the fragmentation memo is not thrown away at every pod.
WORKLOAD_HISTORY_PODS = 10_000
WORKLOAD_REFRESH_FRACTION = 0.1
WORKLOAD_REFRESH_MIN_PODS = 10


def _shape(gpu_count: int, memory_mib_per_gpu: int, core: int, exclusive: bool) -> Shape:
    """A container's shape for the workload; models are left out (not in the annotation)."""
    if exclusive:
        memory_mib_per_gpu = core = 0
    return Shape(0, gpu_count, memory_mib_per_gpu, core, exclusive, frozenset())


def shapes_of_request(request: PodRequest) -> tuple[Shape, ...]:
    return tuple(
        _shape(
            item.request.gpu_count,
            item.request.memory_mib_per_gpu,
            item.request.core_percent_per_gpu,
            item.request.exclusive,
        )
        for item in request.containers
        if not item.init
    )


def shapes_of_charges(charges: dict[str, Allocation]) -> tuple[Shape, ...]:
    return tuple(
        _shape(
            len(allocation.gpu_shares),
            allocation.gpu_shares[0].memory_mib,
            allocation.gpu_shares[0].core_percent,
            allocation.gpu_shares[0].exclusive,
        )
        for name, allocation in charges.items()
        if allocation.gpu_shares and name != INIT_CHARGE_NAME
    )


class ClusterCache:
    def __init__(self, units: Units | None = None) -> None:
        self.units = units or Units()
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[str, PodState] = {}
        self.ledger = Ledger([])
        self._placers: dict[str, Placer] = {}
        self._aside: set[str] = set()  # pods whose shares could not be counted (see _enter)
        self.policy_names: list[str] = []  # the node policies seen, by id
        self._policy_ids: np.ndarray | None = None  # each ledger node's policy id
        self._requests: dict[str, PodRequest | RequestError] = {}  # by pod uid
        self.synced = {"nodes": False, "pods": False}
        self._seen_shapes: dict[str, tuple[Shape, ...]] = {}  # by pod uid, oldest first
        self._shape_counts: Counter[Shape] = Counter()
        self._workload: TargetWorkload | None = None
        self._workload_pods = 0  # pods seen when the workload was last computed
        self._pods_seen = 0
        # Called with a node's name when a pod that ended or was deleted gives back its
        # shares (nudge.CapacityNudger.freed); under the lock, so it must not block.
        self.on_freed: Callable[[str], None] | None = None

    # -- nodes -----------------------------------------------------------------------------

    def node_policy_ids(self) -> np.ndarray:
        """Each ledger node's policy (label) as an index into ``policy_names``."""
        with self.lock:
            if self._policy_ids is None:
                ids = {name: i for i, name in enumerate(self.policy_names)}
                for info in self.nodes.values():
                    if info.policy not in ids:
                        ids[info.policy] = len(self.policy_names)
                        self.policy_names.append(info.policy)
                self._policy_ids = np.array(
                    [ids[self.nodes[node.name].policy] for node in self.ledger.nodes],
                    dtype=np.int64,
                )
            return self._policy_ids

    def upsert_node(self, obj: dict[str, Any]) -> None:
        name, source = node_source(obj)
        with self.lock:
            known = self.nodes.get(name)
            if known is not None and known.source == source:
                return
        info = node_info(obj)
        with self.lock:
            old = self.nodes.get(info.name)
            self.nodes[info.name] = info
            if old is None or old.policy != info.policy:
                self._policy_ids = None
            if old is None or old.node != info.node:
                if info.problem and (old is None or old.problem != info.problem):
                    log.info("node %s: not used: %s", info.name, info.problem)
                self._rebuild()

    def delete_node(self, name: str) -> None:
        with self.lock:
            if self.nodes.pop(name, None) is not None:
                self._rebuild()

    def replace_nodes(self, objs: list[dict[str, Any]]) -> None:
        """A full list of the nodes (a watch's initial list or a resync)."""
        with self.lock:
            self.nodes = {info.name: info for info in map(node_info, objs)}
            self._rebuild()
            self.synced["nodes"] = True

    def _rebuild(self) -> None:
        usable = [info.node for _, info in sorted(self.nodes.items()) if info.node is not None]
        self.ledger = Ledger(usable)
        self._placers.clear()
        self._policy_ids = None
        self._aside.clear()
        for state in self.pods.values():
            state.in_ledger = False
            self._enter(state)

    def _enter(self, state: PodState) -> None:
        """Reserve a pod's allocations; on failure, reserve none and keep it aside."""
        done: list[str] = []
        try:
            for allocation in state.allocations.values():
                self.ledger.reserve(allocation)
                done.append(allocation.request_name)
        except (CapacityError, ModelError, KeyError) as error:
            for name in done:
                self.ledger.release(name)
            if state.key not in self._aside:
                log.warning(
                    "pod %s: its shares on %s cannot be counted yet: %s",
                    state.key,
                    state.node,
                    error,
                )
            self._aside.add(state.key)
            return
        state.in_ledger = True
        self._aside.discard(state.key)

    def _retry_aside(self) -> None:
        """Count again the pods set aside, now that some capacity moved.

        Two annotations rewritten one after the other (the device plugin correcting a swap of
        two pods' GPUs) name one GPU twice for a moment; the pod that could not be counted
        then must be counted as soon as the other one moves, not at the next relist.
        """
        for key in list(self._aside):
            state = self.pods.get(key)
            if state is None or state.in_ledger:
                self._aside.discard(key)
            else:
                self._enter(state)

    def _leave(self, state: PodState) -> None:
        if state.in_ledger:
            for allocation in state.allocations.values():
                self.ledger.release(allocation.request_name)
            state.in_ledger = False

    # -- pods ------------------------------------------------------------------------------

    def upsert_pod(self, obj: dict[str, Any]) -> None:
        key = pod_key(obj)
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        with self.lock:
            current = self.pods.get(key)
            if protocol.pod_ended(obj):
                self._requests.pop(uid, None)
                self._drop(key, freed=True)
                return
            allocations = allocations_from_pod(obj)
            if allocations is None:
                # Not bound with an allocation (yet): keep our own assumption if any, but
                # forget shares recorded for another pod of the same name.
                if current is not None and (current.uid != uid or not current.assumed):
                    self._drop(key)
                return
            node = obj["spec"]["nodeName"]
            if (
                current is not None
                and current.uid == uid
                and current.node == node
                and current.allocations == allocations
            ):
                current.assumed = False
                return
            self._drop(key)
            state = PodState(key, uid, node, allocations, assumed=False)
            self.pods[key] = state
            self._enter(state)
            if self._aside:
                self._retry_aside()
            self._requests.pop(uid, None)
            self._observe(uid, shapes_of_charges(allocations))

    def delete_pod(self, obj: dict[str, Any]) -> None:
        key = pod_key(obj)
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        with self.lock:
            self._requests.pop(uid, None)
            current = self.pods.get(key)
            if current is not None and (not uid or current.uid == uid):
                self._drop(key, freed=True)

    def replace_pods(self, objs: list[dict[str, Any]]) -> None:
        """A full list of the pods; assumptions in flight are kept unless their pod is gone."""
        with self.lock:
            seen = {pod_key(obj) for obj in objs}
            for key, state in list(self.pods.items()):
                if not state.assumed or key not in seen:
                    self._drop(key)
            for obj in objs:
                self.upsert_pod(obj)
            self.synced["pods"] = True

    def _drop(self, key: str, freed: bool = False) -> None:
        state = self.pods.pop(key, None)
        self._aside.discard(key)
        if state is not None:
            held = state.in_ledger
            self._leave(state)
            if held and self._aside:
                self._retry_aside()
            if freed and held and self.on_freed is not None:
                self.on_freed(state.node)

    # -- the target workload ---------------------------------------------------------------

    def _observe(self, uid: str, shapes: tuple[Shape, ...]) -> None:
        """Count a pod's container shapes in the workload history, once per pod."""
        if not uid or not shapes or uid in self._seen_shapes:
            return
        self._seen_shapes[uid] = shapes
        self._shape_counts.update(shapes)
        self._pods_seen += 1
        if len(self._seen_shapes) > WORKLOAD_HISTORY_PODS:
            oldest = next(iter(self._seen_shapes))
            self._shape_counts.subtract(self._seen_shapes.pop(oldest))

    def target_workload(self) -> TargetWorkload:
        """The workload the fragmentation-aware policies place against (see above)."""
        with self.lock:
            since = self._pods_seen - self._workload_pods
            due = max(WORKLOAD_REFRESH_MIN_PODS, WORKLOAD_REFRESH_FRACTION * self._workload_pods)
            if self._workload is None or since >= due:
                self._workload = TargetWorkload.from_shape_counts(self._shape_counts)
                self._workload_pods = self._pods_seen
                for policy in [p for p in self._placers if resolve_policy(p).needs_workload]:
                    del self._placers[policy]
            return self._workload

    # -- binding ---------------------------------------------------------------------------

    def assume(self, key: str, uid: str, node: str, allocations: dict[str, Allocation]) -> None:
        """Record allocations already reserved in the ledger by the caller, as assumed."""
        with self.lock:
            self.pods[key] = PodState(key, uid, node, allocations, assumed=True, in_ledger=True)

    def forget(self, key: str, uid: str) -> None:
        """Roll back an assumption (a bind that failed), if it is still ours."""
        with self.lock:
            state = self.pods.get(key)
            if state is not None and state.uid == uid and state.assumed:
                self._drop(key)

    def release_pod(self, key: str) -> None:
        with self.lock:
            self._drop(key)

    # -- helpers for the verbs -------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return all(self.synced.values())

    def placer(self, policy: str) -> Placer:
        """A placer over the current ledger; PolicyError for a policy the extender cannot run."""
        with self.lock:
            workload = None
            if resolve_policy(policy).needs_workload:
                workload = self.target_workload()  # may drop a stale placer
                if not workload.shapes:
                    raise PolicyError(f"policy {policy} needs a target workload: no GPU pod seen")
            placer = self._placers.get(policy)
            if placer is None:
                placer = Placer(self.ledger, policy, workload=workload)
                self._placers[policy] = placer
            return placer

    def pod_request(self, pod: dict[str, Any]) -> PodRequest:
        """The pod's parsed requests, remembered by uid for its bind; RequestError if bad."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        try:
            parsed: PodRequest | RequestError = parse_pod(pod, self.units)
        except RequestError as error:
            parsed = error
        with self.lock:
            if uid:
                if len(self._requests) > 100_000:
                    self._requests.clear()
                self._requests[uid] = parsed
                if isinstance(parsed, PodRequest):
                    self._observe(uid, shapes_of_request(parsed))
        if isinstance(parsed, RequestError):
            raise parsed
        return parsed

    def remembered_request(self, uid: str) -> PodRequest | RequestError | None:
        with self.lock:
            return self._requests.get(uid)
