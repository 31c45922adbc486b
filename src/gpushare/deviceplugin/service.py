"""The device plugin's state and its gRPC services, one per resource.

``DevicePlugin`` holds what every resource's service shares: the inventory, GPU health, the pod
source, the reservations made by GetPreferredAllocation, the containers already served and the
decision served for each ID set (until kubelet's pod resources record confirms who holds it).
Allocate does no I/O on the API server: it matches against the pod source's last view (asking
it once for a fresh one when nothing matches) and queues the phase write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpushare import protocol
from gpushare.deviceplugin import matching, swaps
from gpushare.deviceplugin.files import ContainerFiles
from gpushare.deviceplugin.inventory import Inventory, pick_ids
from gpushare.deviceplugin.kube import NodeWriter, PodSource
from gpushare.deviceplugin.response import HostPaths, container_response, limits_text
from gpushare.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger("gpushare.deviceplugin")

RESERVATION_TTL_S = 120.0  # GetPreferredAllocation's choice waits this long for its Allocate
WATCH_POLL_S = 1.0  # how often an idle ListAndWatch stream checks that it is still wanted
# A served ID set kubelet never reports (the pod failed admission after Allocate, or went) is
# forgotten after this long.
GIVEN_TTL_S = 600.0


class AllocationError(RuntimeError):
    """Allocate cannot serve a container; the message is what kubelet shows."""


@dataclass(frozen=True, slots=True)
class Settings:
    node: str
    memory_mib_per_unit: int = protocol.MIB_PER_GIB
    strategies: tuple[str, ...] = ("envvar",)
    library_host_path: str = protocol.HOST_LIBRARY_PATH
    host_state_root: Path = Path(protocol.HOST_STATE_ROOT)
    reservation_ttl_s: float = RESERVATION_TTL_S
    given_ttl_s: float = GIVEN_TTL_S


@dataclass(slots=True)
class _Reservation:
    ident: tuple[str, str]
    expires_at: float


@dataclass
class DevicePlugin:
    """The shared state behind the three resources' services."""

    settings: Settings
    inventory: Inventory
    pods: PodSource
    writer: NodeWriter
    clock: Callable[[], float] = time.monotonic
    lock: threading.Condition = field(default_factory=threading.Condition)
    healthy: dict[str, bool] = field(default_factory=dict)
    version: int = 0
    stopping: bool = False
    _reserved: dict[tuple[str, frozenset[str]], _Reservation] = field(default_factory=dict)
    _served: dict[str, set[str]] = field(default_factory=dict)  # pod uid -> containers
    # (resource, device IDs) -> the decision served for them and when, until kubelet's record
    # says who holds them (swaps.py)
    _given: dict[swaps.IdSet, tuple[matching.Pending, float]] = field(default_factory=dict)
    # pod uid of a decision another pod's container holds -> that pod's uid (its files are in use)
    _borrowed: dict[str, str] = field(default_factory=dict)
    # called after an Allocate served a decision (the pod resources reconciler's wake)
    on_served: Callable[[], None] | None = None
    # matching's parse of each assumed pod, kept while its annotations stay the same
    _memo: dict[str, tuple[object, tuple[list[matching.Pending], str]]] = field(
        default_factory=dict
    )
    _memo_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.files = ContainerFiles(self.settings.host_state_root)
        self.healthy = {gpu.uuid: self.healthy.get(gpu.uuid, True) for gpu in self.inventory.gpus}

    # -- health and ListAndWatch ---------------------------------------------------------

    def gpu_infos(self) -> list[protocol.GpuInfo]:
        with self.lock:
            return [gpu.info(self.healthy[gpu.uuid]) for gpu in self.inventory.gpus]

    def publish(self) -> None:
        """Writes the node's gpushare.io/gpus annotation (queued; retried while it fails)."""
        self.writer.set_gpus(self.gpu_infos())

    def set_health(self, healthy: dict[str, bool]) -> None:
        with self.lock:
            if all(self.healthy.get(uuid) == value for uuid, value in healthy.items()):
                return
            self.healthy.update(healthy)
            self.version += 1
            self.lock.notify_all()
        self.publish()

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()

    def watch(
        self, resource: str, active: Callable[[], bool]
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        """The device list now, then again after every health change, while ``active()``."""
        seen = -1
        while True:
            with self.lock:
                while self.version == seen and not self.stopping and active():
                    self.lock.wait(WATCH_POLL_S)
                if self.stopping or not active():
                    return
                seen = self.version
                healthy = dict(self.healthy)
            yield self.inventory.list_response(resource, healthy)

    # -- choosing the pod ----------------------------------------------------------------

    def _excluded(
        self, now: float, keep: tuple[str, frozenset[str]] | None = None
    ) -> set[tuple[str, str]]:
        """Served containers and live reservations (but ``keep``'s), dropping expired ones."""
        for key in [k for k, r in self._reserved.items() if r.expires_at <= now]:
            del self._reserved[key]
        excluded = {(uid, c) for uid, containers in self._served.items() for c in containers}
        excluded.update(r.ident for k, r in self._reserved.items() if k != keep)
        return excluded

    def _pending(self) -> matching.PendingSet:
        pods = self.pods.pods()
        with self._memo_lock:
            return matching.pending_containers(
                pods, self.settings.node, self.settings.memory_mib_per_unit, self._memo
            )

    def preferred(
        self, resource: str, request: api_pb2.PreferredAllocationRequest
    ) -> api_pb2.PreferredAllocationResponse:
        """Chooses each container's pod now and encodes the choice in the device IDs."""
        response = api_pb2.PreferredAllocationResponse()
        pending = self._pending()
        with self.lock:
            now = self.clock()
            for ask in request.container_requests:
                size = ask.allocation_size
                excluded = self._excluded(now)
                decision = matching.choose(pending, resource, size, excluded)
                if resource == protocol.RESOURCE_GPU_COUNT and decision is not None:
                    wanted = [share.uuid for share in decision.shares]
                    available = set(ask.available_deviceIDs)
                    first = [u for u in wanted if u in available]
                    ids = pick_ids(
                        [*first, *ask.available_deviceIDs], ask.must_include_deviceIDs, size
                    )
                else:
                    taken = {i for key in self._reserved if key[0] == resource for i in key[1]}
                    # Lazily: with MiB units the list can hold 100,000 IDs; few are needed.
                    free = (i for i in ask.available_deviceIDs if i not in taken)
                    ids = pick_ids(free, ask.must_include_deviceIDs, size)
                if decision is not None:
                    self._reserved[(resource, frozenset(ids))] = _Reservation(
                        decision.ident, now + self.settings.reservation_ttl_s
                    )
                response.container_responses.add(deviceIDs=ids)
        return response

    def _decide(
        self, resource: str, ids: frozenset[str], pending: matching.PendingSet
    ) -> matching.Pending | None:
        """The container these device IDs are for; the lock is held."""
        now = self.clock()
        key = (resource, ids)
        # The reservation made for exactly these IDs; else (kubelet allocated other IDs than
        # it was preferred) the oldest live reservation for this many: kubelet admits one
        # container at a time, so it is the container that preference was made for.
        keys = [key] if key in self._reserved else []
        keys += sorted(
            (k for k in self._reserved if k[0] == resource and len(k[1]) == len(ids) and k != key),
            key=lambda k: self._reserved[k].expires_at,
        )
        for candidate in keys:
            reservation = self._reserved[candidate]
            if reservation.expires_at <= now:
                continue
            decision = matching.find(pending, reservation.ident)
            if decision is not None and reservation.ident not in self._excluded(
                now, keep=candidate
            ):
                del self._reserved[candidate]
                return decision
        uuids = ids if resource == protocol.RESOURCE_GPU_COUNT else None
        return matching.choose(pending, resource, len(ids), self._excluded(now), uuids)

    # -- Allocate ------------------------------------------------------------------------

    def allocate(self, resource: str, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """One response per container request; AllocationError if one cannot be served."""
        response = api_pb2.AllocateResponse()
        if resource not in matching.DECIDING_RESOURCES:
            # gpu-core is counted by kubelet only; the container's gpu-mem Allocate serves it.
            for _ in request.container_requests:
                response.container_responses.add()
            return response
        for ask in request.container_requests:
            ids = frozenset(ask.devices_ids)
            self._check_ids(resource, ids)
            decision, pending = self._match(resource, ids)
            try:
                response.container_responses.append(self._serve(decision, pending))
            except OSError:
                self._unserve(decision, (resource, ids))  # it can be served by a later try
                raise
        if self.on_served is not None:
            self.on_served()
        return response

    def _check_ids(self, resource: str, ids: frozenset[str]) -> None:
        if not ids:
            raise AllocationError(f"{resource}: Allocate named no devices")
        unknown = sorted(ids - self.inventory.ids[resource])
        if unknown:
            raise AllocationError(
                f"{resource}: device(s) {', '.join(unknown[:3])} are not devices of node "
                f"{self.settings.node}"
            )

    def _match(
        self, resource: str, ids: frozenset[str]
    ) -> tuple[matching.Pending, matching.PendingSet]:
        pending = self._pending()
        decision = self._take(resource, ids, pending)
        if decision is None and self.pods.refresh():
            # The pod may be newer than the last view (kubelet and the plugin watch apart).
            pending = self._pending()
            decision = self._take(resource, ids, pending)
        if decision is None:
            detail = "; ".join(pending.problems[:5])
            raise AllocationError(
                f"no pod assumed on node {self.settings.node} has a container waiting for "
                f"{len(ids)} {resource}"
                + (f" (not matched: {detail})" if detail else "")
                + ("" if self.pods.synced() else " (the API server is unreachable)")
            )
        return decision, pending

    def _take(
        self, resource: str, ids: frozenset[str], pending: matching.PendingSet
    ) -> matching.Pending | None:
        """Decides and marks the container served in one step, so no one else can take it."""
        with self.lock:
            decision = self._decide(resource, ids, pending)
            if decision is not None:
                self._served.setdefault(decision.uid, set()).add(decision.container)
                if not decision.one_shot:  # kubelet's List never reports those
                    self._given[(resource, ids)] = (decision, self.clock())
            return decision

    def _unserve(self, decision: matching.Pending, id_set: swaps.IdSet) -> None:
        with self.lock:
            self._served.get(decision.uid, set()).discard(decision.container)
            self._given.pop(id_set, None)

    def _serve(
        self, decision: matching.Pending, pending: matching.PendingSet
    ) -> api_pb2.ContainerAllocateResponse:
        paths = None
        if not decision.exclusive:
            limits, state = self.files.prepare(
                decision.uid, decision.container, limits_text(decision.shares)
            )
            paths = HostPaths(
                library=self.settings.library_host_path,
                ld_so_preload=str(self.files.preload()),
                limits=str(limits),
                state_dir=str(state),
            )
        result = container_response(decision, self.settings.strategies, paths)
        with self.lock:
            served = self._served.get(decision.uid, set())
            done = pending.by_pod.get(decision.uid, frozenset()) <= served
        log.info(
            "served %s container %s: %s",
            decision.key,
            decision.container,
            ", ".join(f"GPU {s.index} {s.memory_mib} MiB core {s.core}" for s in decision.shares),
        )
        if done:
            namespace, _, name = decision.key.partition("/")
            self.writer.set_phase_allocated(namespace, name, decision.uid)
        return result

    def forget_gone(self) -> None:
        """Drops served records of pods no longer assumed (their phase write has landed)."""
        assumed = {p.uid for p in self._pending().containers}
        with self.lock:
            for uid in [u for u in self._served if u not in assumed]:
                del self._served[uid]

    def live_uids(self) -> set[str]:
        """Pods on the node whose containers may still run (not Succeeded or Failed), and the
        pods whose decision (and so whose files) a live pod's container holds after a swap."""
        live = {
            str((p.get("metadata") or {}).get("uid"))
            for p in self.pods.pods()
            if not protocol.pod_ended(p)
        }
        with self.lock:
            for uid in [u for u, holder in self._borrowed.items() if holder not in live]:
                del self._borrowed[uid]
            live.update(self._borrowed)
        return live

    # -- kubelet's record: who really holds what (swaps.py) ------------------------------

    def unreported(self) -> int:
        """Served ID sets that kubelet's pod resources record has not confirmed yet."""
        with self.lock:
            return len(self._given)

    def reconcile(self, held: list[swaps.Held]) -> int:
        """Rewrites the allocations of pods whose containers exchanged decisions, given what
        kubelet reports each container holds; the count of served ID sets still unreported."""
        pods = self.pods.pods()
        with self.lock:
            now = self.clock()
            expired = [
                k for k, (_, at) in self._given.items() if now - at > self.settings.given_ttl_s
            ]
            for key in expired:
                decision = self._given.pop(key)[0]
                log.info(
                    "kubelet never reported who holds the %s of %s %s; forgotten",
                    key[0],
                    decision.key,
                    decision.container,
                )
            given = {key: decision for key, (decision, _) in self._given.items()}
            found = swaps.find_swaps(given, held, pods)
            for key in found.settled:
                del self._given[key]
            for cycle in found.cycles:
                for move in cycle:
                    if move.got.uid != move.uid:
                        self._borrowed[move.got.uid] = move.uid
            remaining = len(self._given)
        for cycle in found.cycles:
            log.warning(
                "kubelet admitted containers in another order than assumed: %s; rewriting %s",
                swaps.describe(cycle),
                protocol.ANNOTATION_ALLOCATION,
            )
        for problem in found.problems:
            log.warning("not rewriting %s of %s", protocol.ANNOTATION_ALLOCATION, problem)
        for cycle in found.cycles:
            for move in cycle:
                if move.got.uid != move.uid or move.got.container != move.container:
                    try:
                        self.files.mark_owner(
                            move.got.uid, move.got.container, move.uid, move.container
                        )
                    except OSError as error:
                        log.warning("cannot mark who uses %s's files: %s", move.got.key, error)
        for rewrite in found.rewrites:
            self.writer.set_allocation(
                rewrite.namespace, rewrite.name, rewrite.uid, rewrite.allocation
            )
        return remaining


class ResourceService(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin gRPC service of one resource."""

    def __init__(self, plugin: DevicePlugin, resource: str) -> None:
        self.plugin = plugin
        self.resource = resource

    def options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False,
            get_preferred_allocation_available=self.resource in matching.DECIDING_RESOURCES,
        )

    def GetDevicePluginOptions(self, request, context):
        return self.options()

    def ListAndWatch(self, request, context):
        yield from self.plugin.watch(self.resource, context.is_active)

    def GetPreferredAllocation(self, request, context):
        return self.plugin.preferred(self.resource, request)

    def Allocate(self, request, context):
        try:
            return self.plugin.allocate(self.resource, request)
        except AllocationError as error:
            log.error("Allocate %s: %s", self.resource, error)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"gpushare: {error}")
        except OSError as error:
            log.error("Allocate %s: %s", self.resource, error)
            context.abort(grpc.StatusCode.INTERNAL, f"gpushare: cannot write files: {error}")

    def PreStartContainer(self, request, context):
        return api_pb2.PreStartContainerResponse()
