"""The placement engine: filter nodes with reasons, score them by policy, choose the GPUs.

One engine serves the scheduler extender (a few calls per pod, nodes named by kube-scheduler)
and the simulator (ten thousand pods per run over a thousand nodes), so filtering and most
scoring are vectorised over all nodes of the ledger at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from gpushare.model import FULL_CORE_PERCENT, Allocation, GpuShare, Ledger, Request
from gpushare.placement.frag_cache import FragmentationCache
from gpushare.placement.fragmentation import TargetWorkload
from gpushare.placement.policies import POLICIES, Context, Policy, PolicyError


@dataclass(frozen=True, slots=True)
class NoFit:
    """Why a request fits nowhere: each reason with the number of nodes it applies to."""

    reasons: dict[str, int]
    node_count: int

    def message(self) -> str:
        """In kube-scheduler's style: '0/12 nodes are available: 8 <reason>, 4 <reason>.'"""
        parts = [
            f"{count} {reason}" for reason, count in sorted(self.reasons.items(), key=_by_count)
        ]
        return f"0/{self.node_count} nodes are available: {', '.join(parts)}."


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])


@dataclass(frozen=True, slots=True)
class Placement:
    node_index: int
    allocation: Allocation


def resolve_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise PolicyError(f"unknown policy {name!r} (known: {known})") from None


class Placer:
    """Places requests on a ledger's nodes with a node-level and a GPU-level policy."""

    def __init__(
        self,
        ledger: Ledger,
        node_policy: str,
        gpu_policy: str | None = None,
        workload: TargetWorkload | None = None,
        seed: int = 0,
    ) -> None:
        self.ledger = ledger
        self.node_policy = resolve_policy(node_policy)
        self.gpu_policy = resolve_policy(gpu_policy or node_policy)
        needs_workload = self.node_policy.needs_workload or self.gpu_policy.needs_workload
        if needs_workload and workload is None:
            raise PolicyError(
                f"policy {node_policy}/{gpu_policy or node_policy} needs a target workload"
            )
        fragmentation = FragmentationCache(ledger, workload) if workload is not None else None
        rng = np.random.default_rng(seed)
        # Ties go to the node that comes first in a fixed, seeded order of the nodes, as in
        # kube-scheduler forks used for reproducible simulation; a fresh random pick per tie
        # would scatter pods that a stable order keeps together.
        tie_rank = np.empty(len(ledger), dtype=np.int64)
        tie_rank[rng.permutation(len(ledger))] = np.arange(len(ledger))
        self.context = Context(ledger, fragmentation, rng, tie_rank)

    # -- filtering -------------------------------------------------------------------------

    def eligible_gpus(self, request: Request) -> np.ndarray:
        """(nodes, slots): each GPU that could take one GPU's worth of the request."""
        ledger = self.ledger
        if request.exclusive:
            eligible = ledger.gpu_fully_free()
        else:
            eligible = (
                ledger.gpu_present
                & ledger.gpu_healthy
                & ~ledger.gpu_exclusive
                & (ledger.gpu_free_memory_mib >= request.memory_mib_per_gpu)
                & (ledger.gpu_free_core_percent >= request.core_percent_per_gpu)
            )
        if request.allowed_models:
            allowed = np.array([m in request.allowed_models for m in ledger.models] + [False])
            eligible = eligible & allowed[ledger.gpu_model_id]
        return eligible

    def feasible(self, request: Request) -> tuple[np.ndarray, np.ndarray]:
        """A mask of the nodes that can take the request, and the eligible GPU matrix."""
        ledger = self.ledger
        fits = (ledger.cpu_free_milli >= request.cpu_milli) & (
            ledger.memory_free_mib >= request.memory_mib
        )
        if not request.uses_gpu:
            return fits, np.zeros_like(ledger.gpu_present)
        eligible = self.eligible_gpus(request)
        fits &= eligible.sum(axis=1) >= request.gpu_count
        return fits, eligible

    def reason(self, request: Request, node: int, eligible: np.ndarray | None = None) -> str | None:
        """Why the node cannot take the request, in a few words; None if it can."""
        ledger = self.ledger
        cpu_free = int(ledger.cpu_free_milli[node])
        if cpu_free < request.cpu_milli:
            return f"insufficient CPU (need {request.cpu_milli}m, free {cpu_free}m)"
        memory_free = int(ledger.memory_free_mib[node])
        if memory_free < request.memory_mib:
            return (
                f"insufficient memory (need {_size(request.memory_mib)}, free {_size(memory_free)})"
            )
        if not request.uses_gpu:
            return None
        count = int(ledger.gpu_count[node])
        if count == 0:
            return "no GPU"
        models = {ledger.models[m] for m in ledger.gpu_model_id[node, :count]}
        if request.allowed_models and not models & request.allowed_models:
            return f"GPU model {'|'.join(sorted(models))} not allowed"
        if eligible is None:
            eligible = self.eligible_gpus(request)
        have = int(eligible[node].sum())
        if have >= request.gpu_count:
            return None
        usable = ledger.gpu_present[node] & ledger.gpu_healthy[node] & ~ledger.gpu_exclusive[node]
        if request.allowed_models:
            allowed = np.array([m in request.allowed_models for m in ledger.models] + [False])
            usable &= allowed[ledger.gpu_model_id[node]]
        if request.exclusive:
            return f"{have} whole free GPU(s), need {request.gpu_count}"
        free = np.where(usable, ledger.gpu_free_memory_mib[node], -1)
        best_slot = int(np.argmax(free))
        need = _size(request.memory_mib_per_gpu)
        if request.gpu_count == 1 and free[best_slot] < request.memory_mib_per_gpu:
            index = int(ledger.gpu_index[node, best_slot])
            largest = _size(max(int(free[best_slot]), 0))
            return f"no GPU with {need} free (largest free: {largest} on GPU {index})"
        if request.gpu_count == 1:
            return f"no GPU with {request.core_percent_per_gpu}% core free"
        return f"{have} GPU(s) with {need} free, need {request.gpu_count}"

    def no_fit(self, request: Request, nodes: np.ndarray | None = None) -> NoFit:
        nodes = np.arange(len(self.ledger)) if nodes is None else nodes
        eligible = self.eligible_gpus(request) if request.uses_gpu else None
        reasons = Counter(self.reason(request, int(n), eligible) or "fits" for n in nodes)
        return NoFit(dict(reasons), len(nodes))

    # -- choosing --------------------------------------------------------------------------

    def scores(
        self, request: Request, nodes: np.ndarray, eligible: np.ndarray | None = None
    ) -> np.ndarray:
        """The node policy's score of each of ``nodes`` (all feasible); higher is better.
        ``eligible``: the request's eligible_gpus, if the caller has them already."""
        if eligible is None:
            _, eligible = self.feasible(request)
        return self.node_policy.score_nodes(self.context, request, nodes, eligible)

    def decide(
        self, request: Request, candidates: np.ndarray | None = None, explain: bool = True
    ) -> Placement | NoFit:
        """Choose a node and its GPUs for the request without committing anything.

        Without ``explain``, a request that fits nowhere gets a NoFit with no reasons, which
        saves the simulator a pass over every node for each failed pod.
        """
        fits, eligible = self.feasible(request)
        if candidates is not None:
            restricted = np.zeros_like(fits)
            restricted[candidates] = True
            fits &= restricted
        nodes = np.flatnonzero(fits)
        if len(nodes) == 0:
            if not explain:
                return NoFit({}, len(fits) if candidates is None else len(candidates))
            return self.no_fit(request, candidates)
        if len(nodes) == 1:
            node = int(nodes[0])
        else:
            scores = self.node_policy.score_nodes(self.context, request, nodes, eligible)
            best = nodes[scores >= scores.max() - 1e-9]
            node = int(best[np.argmin(self.context.tie_rank[best])])
        slots = self.gpu_policy.choose_gpus(self.context, request, node, eligible[node])
        return Placement(node, self._allocation(request, node, slots))

    def place(
        self, request: Request, candidates: np.ndarray | None = None, explain: bool = True
    ) -> Placement | NoFit:
        """Decide and commit to the ledger."""
        decision = self.decide(request, candidates, explain)
        if isinstance(decision, Placement):
            self.ledger.reserve(decision.allocation)
        return decision

    def _allocation(self, request: Request, node: int, slots: list[int]) -> Allocation:
        ledger = self.ledger
        gpus = ledger.nodes[node].gpus
        shares = tuple(
            GpuShare(
                uuid=gpus[slot].uuid,
                index=gpus[slot].index,
                memory_mib=gpus[slot].memory_mib
                if request.exclusive
                else request.memory_mib_per_gpu,
                core_percent=FULL_CORE_PERCENT
                if request.exclusive
                else request.core_percent_per_gpu,
                exclusive=request.exclusive,
            )
            for slot in slots
        )
        return Allocation(
            request_name=request.name,
            node_name=ledger.nodes[node].name,
            cpu_milli=request.cpu_milli,
            memory_mib=request.memory_mib,
            gpu_shares=shares,
        )


def _size(mib: int) -> str:
    if mib % 1024 == 0:
        return f"{mib // 1024} GiB"
    return f"{mib} MiB"
