"""Memoised fragmentation of nodes and of the best placement of a shape on a node.

Only one node changes per placement, and nodes in the same state (same free CPU and the same
multiset of GPU states) have the same fragmentation, so results are memoised by node state and,
per request shape, kept in a vector over nodes that is refreshed only where a node's version
moved on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpushare.model import Ledger, Request
from gpushare.placement.fragmentation import Shape, TargetWorkload, WorkloadArrays, fragmentation

MEMO_LIMIT = 2_000_000  # entries; the memo is dropped and rebuilt past this

# A GPU slot's state as far as fragmentation is concerned.
SlotState = tuple[int, int, bool, int, int, bool]
NodeState = tuple[int, tuple[SlotState, ...]]


@dataclass(slots=True)
class _NodeSnapshot:
    version: int
    key: NodeState


@dataclass(slots=True)
class _ShapeVector:
    seen_version: np.ndarray
    increase: np.ndarray


class FragmentationCache:
    """Fragmentation of each node of a ledger, and its growth under a hypothetical placement."""

    def __init__(self, ledger: Ledger, workload: TargetWorkload, memoize: bool = True) -> None:
        """``memoize=False`` recomputes everything on every call: only for measuring what the
        caches save (bench/bench_fragmentation.py)."""
        self.ledger = ledger
        self.memoize = memoize
        self.target = workload
        self.workload = WorkloadArrays(workload, ledger.models)
        self._snapshots: dict[int, _NodeSnapshot] = {}
        self._frag_memo: dict[NodeState, float] = {}
        self._best_memo: dict[tuple[NodeState, Shape], tuple[float, tuple[SlotState, ...]]] = {}
        self._vectors: dict[Shape, _ShapeVector] = {}

    # -- node state ------------------------------------------------------------------------

    def _slot_state(self, node: int, slot: int) -> SlotState:
        ledger = self.ledger
        return (
            int(ledger.gpu_model_id[node, slot]),
            int(ledger.gpu_memory_mib[node, slot]),
            bool(ledger.gpu_healthy[node, slot]),
            int(ledger.gpu_free_memory_mib[node, slot]),
            int(ledger.gpu_free_core_percent[node, slot]),
            bool(ledger.gpu_sharers[node, slot] == 0),
        )

    def state(self, node: int) -> NodeState:
        ledger = self.ledger
        version = int(ledger.node_version[node])
        snapshot = self._snapshots.get(node)
        if snapshot is None or snapshot.version != version:
            count = int(ledger.gpu_count[node])
            # Row slices turned into Python lists at once: far cheaper than per-item reads.
            slots = tuple(
                sorted(
                    zip(
                        ledger.gpu_model_id[node, :count].tolist(),
                        ledger.gpu_memory_mib[node, :count].tolist(),
                        ledger.gpu_healthy[node, :count].tolist(),
                        ledger.gpu_free_memory_mib[node, :count].tolist(),
                        ledger.gpu_free_core_percent[node, :count].tolist(),
                        (ledger.gpu_sharers[node, :count] == 0).tolist(),
                        strict=True,
                    )
                )
            )
            snapshot = _NodeSnapshot(version, (int(ledger.cpu_free_milli[node]), slots))
            self._snapshots[node] = snapshot
        return snapshot.key

    def node_fragmentation(self, node: int) -> float:
        key = self.state(node)
        frag = self._frag_memo.get(key)
        if frag is None:
            frag = float(self._evaluate(key[0], key[1], [()])[0])
            self._remember(self._frag_memo, key, frag)
        return frag

    def cluster_fragmentation(self) -> float:
        return sum(self.node_fragmentation(n) for n in range(len(self.ledger)))

    # -- hypothetical placements -----------------------------------------------------------

    def best_placement(self, node: int, request: Request) -> tuple[float, list[int]]:
        """The lowest fragmentation the node can have after taking the request, and the GPU
        slots that give it. The request must fit the node."""
        frag, chosen_states = self._best(self.state(node), Shape.of(request))
        return frag, self._slots_for(node, chosen_states)

    def _best(self, key: NodeState, shape: Shape) -> tuple[float, tuple[SlotState, ...]]:
        memo_key = (key, shape)
        found = self._best_memo.get(memo_key)
        if found is None:
            found = self._search(key, shape)
            self._remember(self._best_memo, memo_key, found)
        return found

    def increase(self, request: Request, nodes: np.ndarray) -> np.ndarray:
        """Fragmentation growth of each of ``nodes`` (which all fit) if it took the request."""
        shape = Shape.of(request)
        vector = self._vectors.get(shape)
        if vector is None:
            size = len(self.ledger)
            vector = _ShapeVector(np.full(size, -1, dtype=np.int64), np.zeros(size))
            self._vectors[shape] = vector
        versions = self.ledger.node_version
        stale = nodes[vector.seen_version[nodes] != versions[nodes]] if self.memoize else nodes
        for node in stale.tolist():
            new_frag, _ = self._best(self.state(node), shape)
            vector.increase[node] = new_frag - self.node_fragmentation(node)
        vector.seen_version[stale] = versions[stale]
        return vector.increase[nodes]

    def _search(self, key: NodeState, shape: Shape) -> tuple[float, tuple[SlotState, ...]]:
        """Greedy over GPUs: each pick is the GPU whose use leaves the least fragmentation."""
        cpu_free, slots = key
        if shape.gpu_count == 0:
            frag = self._evaluate(cpu_free - shape.cpu_milli, slots, [()])[0]
            return float(frag), ()
        chosen: list[int] = []
        frag = 0.0
        for _ in range(shape.gpu_count):
            candidates = _distinct_candidates(slots, shape, chosen, self.ledger.models)
            trials = [(*chosen, c) for c in candidates]
            frags = self._evaluate(cpu_free - shape.cpu_milli, slots, trials, shape)
            best = int(np.argmin(frags))
            chosen = list(trials[best])
            frag = float(frags[best])
        return frag, tuple(slots[i] for i in chosen)

    def _evaluate(
        self,
        cpu_free: int,
        slots: tuple[SlotState, ...],
        picks: list[tuple[int, ...]],
        shape: Shape | None = None,
    ) -> np.ndarray:
        """Fragmentation of the node state ``slots`` after each set of picks of ``shape``."""
        count = len(picks)
        model_id = np.array([s[0] for s in slots], dtype=np.int64)
        memory = np.array([s[1] for s in slots], dtype=np.int64)
        usable = np.array([s[2] for s in slots], dtype=bool)
        free_memory = np.tile(np.array([s[3] for s in slots], dtype=np.int64), (count, 1))
        free_core = np.tile(np.array([s[4] for s in slots], dtype=np.int64), (count, 1))
        fully_free = np.tile(np.array([s[5] for s in slots], dtype=bool), (count, 1))
        if shape is not None:
            for row, pick in enumerate(picks):
                for i in pick:
                    if shape.exclusive:
                        free_memory[row, i] = 0
                        free_core[row, i] = 0
                    else:
                        free_memory[row, i] -= shape.memory_mib_per_gpu
                        free_core[row, i] -= shape.core_percent_per_gpu
                    fully_free[row, i] = False
        cpu = np.full(count, cpu_free, dtype=np.int64)
        if not slots:
            model_id = np.full(1, -1, dtype=np.int64)
            memory = np.ones(1, dtype=np.int64)
            usable = np.zeros(1, dtype=bool)
            free_memory = np.full((count, 1), -1, dtype=np.int64)
            free_core = np.full((count, 1), -1, dtype=np.int64)
            fully_free = np.zeros((count, 1), dtype=bool)
        return fragmentation(
            self.workload, cpu, free_memory, free_core, fully_free, memory, model_id, usable
        )

    def _slots_for(self, node: int, chosen_states: tuple[SlotState, ...]) -> list[int]:
        """Map chosen slot states back to this node's slots (equal states are interchangeable)."""
        used: list[int] = []
        for wanted in chosen_states:
            for slot in range(int(self.ledger.gpu_count[node])):
                if slot not in used and self._slot_state(node, slot) == wanted:
                    used.append(slot)
                    break
        return used

    def _remember(self, memo: dict, key: object, value: object) -> None:
        if not self.memoize:
            return
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        memo[key] = value


def slot_fits(slot: SlotState, shape: Shape, models: tuple[str, ...]) -> bool:
    model_id, _memory, healthy, free_memory, free_core, fully_free = slot
    if not healthy or (shape.allowed_models and models[model_id] not in shape.allowed_models):
        return False
    if shape.exclusive:
        return fully_free
    return free_memory >= shape.memory_mib_per_gpu and free_core >= shape.core_percent_per_gpu


def _distinct_candidates(
    slots: tuple[SlotState, ...], shape: Shape, chosen: list[int], models: tuple[str, ...]
) -> list[int]:
    """One slot per distinct state among the slots that can take one more GPU of the shape."""
    seen: set[SlotState] = set()
    candidates: list[int] = []
    for i, slot in enumerate(slots):
        if i in chosen or slot in seen or not slot_fits(slot, shape, models):
            continue
        seen.add(slot)
        candidates.append(i)
    return candidates
