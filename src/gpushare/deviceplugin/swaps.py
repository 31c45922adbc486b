"""Which served decisions kubelet gave to another container than they were made for (pure).

Between two pending containers with identical requests nothing kubelet sends names the pod, so
the plugin serves the older assumption first; if kubelet admits the other pod first, the two
containers exchange decisions (docs/deviceplugin.md, "Why this is unambiguous", (c)). kubelet's
pod resources API says afterwards which container holds which device IDs, and the plugin knows
which decision it served for each ID set: together they say what every container really got.
``find_swaps`` turns that into the annotation rewrites that make each pod's
``gpushare.io/allocation`` name the GPUs its container really has.

Decisions move only in closed cycles (each is served once, to a request of its size), and a
cycle is rewritten only once kubelet reports every container in it: rewriting one pod of a
swap alone would make two annotations name the same GPU and none the other, which the
extender would take for free capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare import protocol
from gpushare.deviceplugin.matching import Pending

# A served ID set: (resource, device IDs) as kubelet allocated and reports them.
IdSet = tuple[str, frozenset[str]]


@dataclass(frozen=True, slots=True)
class Held:
    """Device IDs of one resource that kubelet reports a container holds."""

    pod: str  # namespace/name
    container: str
    resource: str
    ids: frozenset[str]

    @property
    def id_set(self) -> IdSet:
        return (self.resource, self.ids)


@dataclass(frozen=True, slots=True)
class Move:
    """A container that holds the decision made for another one."""

    uid: str  # the holder's pod
    pod: str  # namespace/name
    container: str
    got: Pending  # the decision it was served

    def describe(self) -> str:
        gpus = ", ".join(f"GPU {s.index}" for s in self.got.shares)
        got = self.got
        return f"{self.pod} {self.container} holds {gpus} (assumed for {got.key} {got.container})"


@dataclass(frozen=True, slots=True)
class Rewrite:
    """The new ``gpushare.io/allocation`` of one pod."""

    uid: str
    namespace: str
    name: str
    allocation: str  # the whole annotation value


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What a look at kubelet's record found: served ID sets that need no more watching (held
    by their own container, or part of a cycle kubelet now reports whole), the moves (one
    tuple per cycle), the annotation rewrites, and pods that could not be rewritten."""

    settled: frozenset[IdSet]
    cycles: tuple[tuple[Move, ...], ...]
    rewrites: tuple[Rewrite, ...]
    problems: tuple[str, ...] = ()


def _cycle(
    start: IdSet,
    given: Mapping[IdSet, Pending],
    holder: Mapping[IdSet, tuple[str, str]],
    owned: Mapping[tuple[str, str], IdSet],
) -> list[IdSet] | None:
    """The ID sets of the cycle through ``start``, or None while kubelet does not report it
    whole (a holder without a served decision of its own, or one not reported yet)."""
    cycle = [start]
    current = holder[start]
    while True:
        nxt = owned.get(current)  # the decision made for the container holding the last one
        if nxt is None or nxt not in holder:
            return None
        if nxt == start:
            return cycle
        if nxt in cycle or len(cycle) > len(given):
            return None  # not a permutation: never from this plugin's records
        cycle.append(nxt)
        current = holder[nxt]


def find_swaps(
    given: Mapping[IdSet, Pending],
    held: Iterable[Held],
    pods: Iterable[Mapping[str, Any]],
) -> Reconciliation:
    """Compares the decisions served per ID set (``given``) with what kubelet reports each
    container holds (``held``), and rewrites, from the pods' current annotations (``pods``),
    the allocations of the containers of every complete cycle of exchanged decisions."""
    holder: dict[IdSet, tuple[str, str]] = {}
    for item in held:
        if item.id_set in given:
            holder[item.id_set] = (item.pod, item.container)
    owned = {(d.key, d.container): key for key, d in given.items()}
    settled: set[IdSet] = set()
    cycles: list[tuple[Move, ...]] = []
    for key, who in sorted(holder.items(), key=lambda kv: (kv[1], sorted(kv[0][1]))):
        if key in settled:
            continue
        decision = given[key]
        if who == (decision.key, decision.container):
            settled.add(key)
            continue
        cycle = _cycle(key, given, holder, owned)
        if cycle is None:
            continue
        settled.update(cycle)
        moves = []
        for member in cycle:
            pod, container = holder[member]
            uid = given[owned[(pod, container)]].uid
            moves.append(Move(uid, pod, container, given[member]))
        cycles.append(tuple(moves))
    rewrites, problems = _rewrites([m for c in cycles for m in c], pods)
    return Reconciliation(frozenset(settled), tuple(cycles), rewrites, problems)


def _rewrites(
    moves: list[Move], pods: Iterable[Mapping[str, Any]]
) -> tuple[tuple[Rewrite, ...], tuple[str, ...]]:
    """Each moved container's pod with its allocation entry set to what it really got."""
    by_uid: dict[str, list[Move]] = {}
    for move in moves:
        by_uid.setdefault(move.uid, []).append(move)
    if not by_uid:
        return (), ()
    current = {str((p.get("metadata") or {}).get("uid")): p for p in pods}
    rewrites: list[Rewrite] = []
    problems: list[str] = []
    for uid, pod_moves in sorted(by_uid.items()):
        where = pod_moves[0].pod
        pod = current.get(uid)
        if pod is None:
            problems.append(f"{where}: gone (uid {uid}); nothing to rewrite")
            continue
        metadata = pod.get("metadata") or {}
        text = (metadata.get("annotations") or {}).get(protocol.ANNOTATION_ALLOCATION)
        try:
            allocation = protocol.decode_allocation(text if isinstance(text, str) else "")
        except protocol.ProtocolError as error:
            problems.append(f"{where}: {error}")
            continue
        updated = dict(allocation)
        for move in pod_moves:
            updated[move.container] = list(move.got.shares)
        if updated == allocation:
            continue  # already rewritten
        namespace, _, name = where.partition("/")
        rewrites.append(Rewrite(uid, namespace, name, protocol.encode_allocation(updated)))
    return tuple(rewrites), tuple(problems)


def describe(cycle: tuple[Move, ...]) -> str:
    """One log line for a cycle of exchanged decisions."""
    return "; ".join(move.describe() for move in cycle)
