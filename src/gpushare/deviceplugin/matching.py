"""Which pod's container a kubelet request belongs to (pure: pods and a request in, a choice out).

kubelet's Allocate names device IDs, not a pod. The containers that can be behind it are those
of pods bound to this node whose ``gpushare.io/phase`` is ``assumed``, that ask for exactly the
requested number of the resource's devices, and that the plugin has not served yet; they are
taken oldest ``gpushare.io/assume-time`` first (then namespace/name, then the container's place
in the pod, init containers first, which is the order kubelet starts them in). A pod whose
annotations are missing or malformed, or disagree with its resources, is never a candidate:
it is reported, so that the error kubelet shows says why nothing matched. docs/deviceplugin.md
argues why the choice is unambiguous.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare import protocol

# Resources whose Allocate carries a container's GPU decision (gpu-core rides along gpu-mem).
DECIDING_RESOURCES = (protocol.RESOURCE_GPU_MEMORY, protocol.RESOURCE_GPU_COUNT)


@dataclass(frozen=True, slots=True)
class Pending:
    """One container of an assumed pod, with its requests and the extender's decision."""

    uid: str
    key: str  # namespace/name
    container: str
    place: int  # position in the pod: init containers first, in spec order
    amounts: Mapping[str, int]  # device counts kubelet will ask for, by resource
    shares: tuple[protocol.ShareInfo, ...]
    assume_time_ns: int
    # an init container that runs once (not a restartable "sidecar"): kubelet's pod resources
    # List does not report it, so no swap involving it can be seen
    one_shot: bool = False

    @property
    def exclusive(self) -> bool:
        return protocol.RESOURCE_GPU_COUNT in self.amounts

    @property
    def ident(self) -> tuple[str, str]:
        return (self.uid, self.container)


@dataclass(frozen=True, slots=True)
class PendingSet:
    """The containers that can be matched, in matching order, and the pods that cannot."""

    containers: tuple[Pending, ...]
    problems: tuple[str, ...] = field(default=())
    # uid -> names of the pod's containers that carry a decision (all must be served)
    by_pod: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _whole(text: str) -> bool:
    return text.isascii() and text.isdigit()  # not "²", which isdigit() also accepts


def _amount(value: Any) -> int | None:
    text = str(value).strip() if isinstance(value, str | int) else ""
    return int(text) if _whole(text) and not isinstance(value, bool) else None


def _amounts(container: Mapping[str, Any]) -> dict[str, int] | str:
    """The container's gpushare device counts (limits, else requests), or what is wrong."""
    resources = container.get("resources") or {}
    found: dict[str, int] = {}
    for part in ("requests", "limits"):
        for name, value in (resources.get(part) or {}).items():
            if name in protocol.MANAGED_RESOURCES:
                amount = _amount(value)
                if amount is None:
                    return f"{name} must be a whole number, got {value!r}"
                if amount:
                    found[name] = amount
                else:
                    found.pop(name, None)
    return found


def _check(amounts: Mapping[str, int], shares: list[protocol.ShareInfo], unit_mib: int) -> str:
    """'' if the decision serves these requests, else what disagrees."""
    if not shares:
        return "its allocation lists no GPU"
    whole = amounts.get(protocol.RESOURCE_GPU_COUNT)
    if whole is not None:
        if len(shares) != whole or not all(share.exclusive for share in shares):
            return f"{protocol.RESOURCE_GPU_COUNT} {whole} but its allocation has {len(shares)}"
        return ""
    memory = amounts.get(protocol.RESOURCE_GPU_MEMORY)
    if memory is None:
        return f"it asks for no {protocol.RESOURCE_GPU_MEMORY}"
    allocated = sum(share.memory_mib for share in shares)
    if allocated != memory * unit_mib or any(share.exclusive for share in shares):
        return (
            f"{protocol.RESOURCE_GPU_MEMORY} {memory} ({memory * unit_mib} MiB) but its "
            f"allocation has {allocated} MiB"
        )
    return ""


def pending_containers(
    pods: Iterable[Mapping[str, Any]],
    node: str,
    memory_mib_per_unit: int,
    memo: dict[str, tuple[Any, tuple[list[Pending], str]]] | None = None,
) -> PendingSet:
    """The matchable containers of the assumed pods bound to ``node``, in matching order.

    ``memo``: a dict kept between calls; a pod whose allocation and assume-time annotations
    are the same text as last time is not parsed again (its containers' requests cannot
    change: a pod's extended resources are immutable).
    """
    found: list[Pending] = []
    problems: list[str] = []
    by_pod: dict[str, frozenset[str]] = {}
    seen: set[str] = set()
    for pod in pods:
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        annotations = metadata.get("annotations") or {}
        if spec.get("nodeName") != node or metadata.get("deletionTimestamp"):
            continue
        if annotations.get(protocol.ANNOTATION_PHASE) != protocol.PHASE_ASSUMED:
            continue
        if protocol.pod_ended(pod):
            continue
        key = protocol.pod_key(pod)
        uid = str(metadata.get("uid") or key)
        stamp = (
            annotations.get(protocol.ANNOTATION_ALLOCATION),
            annotations.get(protocol.ANNOTATION_ASSUME_TIME),
        )
        seen.add(uid)
        cached = memo.get(uid) if memo is not None else None
        if cached is not None and cached[0] == stamp:
            pod_found, problem = cached[1]
        else:
            pod_found, problem = _pod_containers(uid, key, spec, annotations, memory_mib_per_unit)
            if memo is not None:
                memo[uid] = (stamp, (pod_found, problem))
        if problem:
            problems.append(f"{key}: {problem}")
            continue
        found.extend(pod_found)
        by_pod[uid] = frozenset(p.container for p in pod_found)
    if memo is not None:
        for uid in [u for u in memo if u not in seen]:
            del memo[uid]  # no longer assumed here
    found.sort(key=lambda p: (p.assume_time_ns, p.key, p.place))
    return PendingSet(tuple(found), tuple(problems), by_pod)


def _pod_containers(
    uid: str,
    key: str,
    spec: Mapping[str, Any],
    annotations: Mapping[str, Any],
    unit_mib: int,
) -> tuple[list[Pending], str]:
    text = annotations.get(protocol.ANNOTATION_ALLOCATION)
    if not isinstance(text, str):
        return [], f"annotation {protocol.ANNOTATION_ALLOCATION} is missing"
    try:
        allocation = protocol.decode_allocation(text)
    except protocol.ProtocolError as error:
        return [], str(error)
    assumed = str(annotations.get(protocol.ANNOTATION_ASSUME_TIME, "")).strip()
    if not _whole(assumed):
        return [], f"annotation {protocol.ANNOTATION_ASSUME_TIME} must be ns since the epoch"
    inits = spec.get("initContainers") or []
    containers = [*inits, *(spec.get("containers") or [])]
    found: list[Pending] = []
    for place, container in enumerate(containers):
        name = str(container.get("name") or "")
        amounts = _amounts(container)
        if isinstance(amounts, str):
            return [], f"container {name}: {amounts}"
        if not any(resource in amounts for resource in DECIDING_RESOURCES):
            continue
        shares = allocation.get(name)
        if shares is None:
            return [], f"container {name}: not in annotation {protocol.ANNOTATION_ALLOCATION}"
        problem = _check(amounts, shares, unit_mib)
        if problem:
            return [], f"container {name}: {problem}"
        one_shot = place < len(inits) and container.get("restartPolicy") != "Always"
        found.append(Pending(uid, key, name, place, amounts, tuple(shares), int(assumed), one_shot))
    if not found:
        return [], f"no container asks for {protocol.RESOURCE_GPU_MEMORY} or gpu"
    return found, ""


def choose(
    pending: PendingSet,
    resource: str,
    amount: int,
    exclude: Collection[tuple[str, str]] = (),
    uuids: frozenset[str] | None = None,
) -> Pending | None:
    """The first container asking for ``amount`` of ``resource`` that is not excluded.

    ``uuids``: for whole GPUs, the device IDs kubelet named; a container whose decision is
    exactly those GPUs is taken first (the IDs then identify it), else the oldest by amount.
    """
    candidates = [
        p
        for p in pending.containers
        if p.amounts.get(resource) == amount and p.ident not in exclude
    ]
    if uuids is not None:
        for candidate in candidates:
            if frozenset(share.uuid for share in candidate.shares) == uuids:
                return candidate
    return candidates[0] if candidates else None


def find(pending: PendingSet, ident: tuple[str, str]) -> Pending | None:
    """The pending container ``ident`` (uid, container), if it is still pending."""
    return next((p for p in pending.containers if p.ident == ident), None)
