"""Placement policies and the engine on small hand-made clusters."""

from __future__ import annotations

import numpy as np
import pytest

from gpushare.model import (
    FULL_CORE_PERCENT,
    Allocation,
    CapacityError,
    Gpu,
    GpuShare,
    Ledger,
    Node,
    Request,
)
from gpushare.placement.engine import NoFit, Placement, Placer
from gpushare.placement.fragmentation import TargetWorkload
from gpushare.placement.policies import POLICIES, PolicyError

GPU_MIB = 16000
GIB = 1024
SEEDS = range(5)

# The workload FGD measures against unless a test says otherwise: one GPU, half of it.
HALF_GPU_WORKLOAD = TargetWorkload.from_requests(
    [Request("w", cpu_milli=1000, gpu_count=1, memory_mib_per_gpu=8000, core_percent_per_gpu=10)]
)

ALL_POLICIES = sorted(POLICIES)
# Policies whose scores depend only on node state, so identical nodes tie.
DETERMINISTIC = {"binpack", "spread", "best-fit", "dot-product", "gpu-packing", "fgd"}


def make_node(
    name: str,
    gpus: int = 2,
    model: str | tuple[str, ...] = "A100",
    gpu_mib: int | tuple[int, ...] = GPU_MIB,
    cpu: int = 32000,
    memory: int = 128 * GIB,
    indices: tuple[int, ...] | None = None,
) -> Node:
    indices = tuple(range(gpus)) if indices is None else indices
    models = model if isinstance(model, tuple) else (model,) * len(indices)
    sizes = gpu_mib if isinstance(gpu_mib, tuple) else (gpu_mib,) * len(indices)
    return Node(
        name,
        tuple(
            Gpu(index=i, uuid=f"{name}-gpu{i}", model=m, memory_mib=s)
            for i, m, s in zip(indices, models, sizes, strict=True)
        ),
        cpu_milli=cpu,
        memory_mib=memory,
    )


def hold(
    ledger: Ledger,
    node: str,
    used: dict[int, int] | None = None,
    core: int = 0,
    cpu: int = 0,
    memory: int = 0,
    name: str | None = None,
) -> None:
    """Reserve, directly on the ledger, ``used[index]`` MiB on GPUs of ``node``."""
    used = used or {}
    shares = tuple(
        GpuShare(uuid=f"{node}-gpu{index}", index=index, memory_mib=mib, core_percent=core)
        for index, mib in used.items()
    )
    name = name or f"pre-{node}-{len(ledger.allocations())}"
    ledger.reserve(Allocation(name, node, cpu_milli=cpu, memory_mib=memory, gpu_shares=shares))


def make_placer(
    ledger: Ledger,
    policy: str,
    gpu_policy: str | None = None,
    seed: int = 0,
    workload: TargetWorkload = HALF_GPU_WORKLOAD,
) -> Placer:
    return Placer(ledger, policy, gpu_policy, workload=workload, seed=seed)


def shared(
    name: str = "r", memory: int = 8000, count: int = 1, core: int = 10, cpu: int = 1000, **kw
) -> Request:
    return Request(
        name,
        cpu_milli=cpu,
        memory_mib=kw.pop("host", 1024),
        gpu_count=count,
        memory_mib_per_gpu=memory,
        core_percent_per_gpu=core,
        **kw,
    )


def chosen(decision: Placement | NoFit) -> tuple[str, tuple[int, ...]]:
    assert isinstance(decision, Placement), decision
    return decision.allocation.node_name, decision.allocation.gpu_indices


# -- node and GPU choice in clear-cut situations ---------------------------------------------


def graded_cluster() -> Ledger:
    """n0 has 8000 MiB used on GPU 0, n1 4000 MiB on GPU 0, n2 nothing."""
    ledger = Ledger([make_node("n0"), make_node("n1"), make_node("n2")])
    hold(ledger, "n0", {0: 8000})
    hold(ledger, "n1", {0: 4000})
    return ledger


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("binpack", ("n0", (0,))),
        ("best-fit", ("n0", (0,))),
        ("dot-product", ("n0", (0,))),
        ("gpu-packing", ("n0", (0,))),
        ("spread", ("n2", (0,))),
    ],
)
@pytest.mark.parametrize("seed", SEEDS)
def test_fullest_or_emptiest_node(policy: str, expected: tuple, seed: int) -> None:
    ledger = graded_cluster()
    decision = make_placer(ledger, policy, seed=seed).decide(shared(memory=8000))
    assert chosen(decision) == expected


@pytest.mark.parametrize("policy", ["binpack", "best-fit", "dot-product"])
@pytest.mark.parametrize("seed", SEEDS)
def test_cpu_only_request_goes_to_node_with_least_cpu_left(policy: str, seed: int) -> None:
    ledger = Ledger([make_node("n0"), make_node("n1")])
    hold(ledger, "n0", cpu=2000)
    hold(ledger, "n1", cpu=28000)
    decision = make_placer(ledger, policy, seed=seed).decide(Request("c", cpu_milli=2000))
    assert chosen(decision) == ("n1", ())


def four_gpu_node() -> Ledger:
    """One node whose GPUs have 8000, 12000, 16000 and 4000 MiB free."""
    ledger = Ledger([make_node("n0", gpus=4)])
    hold(ledger, "n0", {0: 8000, 1: 4000, 3: 12000})
    return ledger


@pytest.mark.parametrize(
    ("policy", "expected_gpu"),
    [
        ("binpack", 0),  # tightest that fits
        ("best-fit", 0),
        ("dot-product", 0),
        ("gpu-packing", 0),  # in use, tightest
        ("spread", 2),  # emptiest
        ("fgd", 2),  # 8000 MiB stays usable for the half-GPU workload
    ],
)
def test_gpu_choice_within_node(policy: str, expected_gpu: int) -> None:
    ledger = four_gpu_node()
    decision = make_placer(ledger, policy).place(shared(memory=6000))
    assert chosen(decision) == ("n0", (expected_gpu,))
    assert ledger.gpu_free_memory_mib[0, expected_gpu] == [2000, 6000, 10000, 4000][expected_gpu]


def test_random_gpu_choice_is_eligible_and_varies_with_seed() -> None:
    picks = set()
    for seed in range(30):
        decision = make_placer(four_gpu_node(), "random", seed=seed).decide(shared(memory=6000))
        picks.add(chosen(decision)[1])
    # GPU 3 has only 4000 MiB free.
    assert picks == {(0,), (1,), (2,)}


def test_gpu_packing_prefers_shared_gpu_over_tighter_idle_one() -> None:
    # GPU 0 is an idle 8000 MiB card, GPU 1 a 16000 MiB card with 4000 MiB in use.
    ledger = Ledger([make_node("n0", model=("T4", "A100"), gpu_mib=(8000, 16000))])
    hold(ledger, "n0", {1: 4000})
    assert chosen(make_placer(ledger, "gpu-packing").decide(shared(memory=6000))) == ("n0", (1,))
    assert chosen(make_placer(ledger, "binpack").decide(shared(memory=6000))) == ("n0", (0,))


def test_gpu_packing_prefers_busy_node_over_idle_node() -> None:
    ledger = Ledger([make_node("idle"), make_node("busy")])
    hold(ledger, "busy", {0: 12000})
    # Only an idle GPU fits on either node; the busy node's idle GPU wins.
    for seed in SEEDS:
        placer = make_placer(ledger, "gpu-packing", seed=seed)
        assert chosen(placer.decide(shared(memory=8000))) == ("busy", (1,))


@pytest.mark.parametrize("seed", SEEDS)
def test_fgd_avoids_stranding_where_binpack_does_not(seed: int) -> None:
    # The target workload needs 8000 MiB per GPU. Putting 4000 MiB on n0 (10000 free) would
    # leave 6000 MiB that no typical task can use; on n1 the 12000 MiB left still serve one.
    ledger = Ledger([make_node("n0", gpus=1), make_node("n1", gpus=1)])
    hold(ledger, "n0", {0: 6000})
    request = shared(memory=4000)
    assert chosen(make_placer(ledger, "binpack", seed=seed).decide(request))[0] == "n0"
    assert chosen(make_placer(ledger, "fgd", seed=seed).decide(request))[0] == "n1"


@pytest.mark.parametrize("seed", SEEDS)
def test_fgd_fills_a_fragment(seed: int) -> None:
    # n0's GPU has 5000 MiB free: stranded for the workload. A 5000 MiB request there removes
    # the fragment; anywhere else it creates a new one.
    ledger = Ledger([make_node("n0", gpus=1), make_node("n1", gpus=1), make_node("n2", gpus=1)])
    hold(ledger, "n0", {0: 11000})
    hold(ledger, "n1", {0: 1000})
    decision = make_placer(ledger, "fgd", seed=seed).decide(shared(memory=5000))
    assert chosen(decision) == ("n0", (0,))


def test_random_with_single_feasible_node() -> None:
    ledger = Ledger([make_node("n0"), make_node("n1"), make_node("n2")])
    hold(ledger, "n0", {0: 12000, 1: 12000})
    hold(ledger, "n2", {0: 12000, 1: 12000})
    for seed in range(10):
        assert chosen(make_placer(ledger, "random", seed=seed).decide(shared()))[0] == "n1"


# -- ties ------------------------------------------------------------------------------------


def identical_cluster(count: int = 4) -> Ledger:
    return Ledger([make_node(f"n{i}") for i in range(count)])


@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_same_seed_same_choice(policy: str, seed: int) -> None:
    requests = [shared(f"r{i}", memory=4000 * (1 + i % 3)) for i in range(6)]
    runs = []
    for _ in range(2):
        ledger = identical_cluster()
        placer = make_placer(ledger, policy, seed=seed)
        runs.append([placer.place(request) for request in requests])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize("seed", range(4))
def test_ties_go_to_first_node_in_seeded_order(policy: str, seed: int) -> None:
    ledger = identical_cluster()
    placer = make_placer(ledger, policy, seed=seed)
    request = shared()
    nodes = np.arange(len(ledger))
    scores = placer.scores(request, nodes)
    decision = placer.decide(request)
    assert isinstance(decision, Placement)
    if policy in DETERMINISTIC:
        assert np.all(scores == scores[0]), scores
    if np.all(scores == scores[0]):
        assert decision.node_index == int(np.argmin(placer.context.tie_rank))


def test_tie_rank_is_a_seeded_permutation() -> None:
    ranks = {
        seed: make_placer(identical_cluster(6), "binpack", seed=seed).context.tie_rank.tolist()
        for seed in range(10)
    }
    for rank in ranks.values():
        assert sorted(rank) == list(range(6))
    assert (
        make_placer(identical_cluster(6), "binpack", seed=3).context.tie_rank.tolist() == (ranks[3])
    )
    assert len({tuple(rank) for rank in ranks.values()}) > 1


def test_ties_between_identical_nodes_depend_on_seed() -> None:
    first_nodes = {
        chosen(make_placer(identical_cluster(), "binpack", seed=seed).decide(shared()))[0]
        for seed in range(20)
    }
    assert len(first_nodes) > 1


def test_binpack_keeps_filling_the_tie_winner() -> None:
    ledger = identical_cluster()
    placer = make_placer(ledger, "binpack", seed=5)
    nodes = {chosen(placer.place(shared(f"r{i}", memory=4000)))[0] for i in range(8)}
    assert len(nodes) == 1  # 8 x 4000 MiB = two full GPUs of one node


# -- multi-GPU, exclusive, model constraints, CPU-only -----------------------------------------


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_multi_gpu_shared_request(policy: str) -> None:
    ledger = Ledger([make_node("n0", gpus=4), make_node("n1", gpus=2)])
    hold(ledger, "n1", {0: 12000})
    before = ledger.gpu_free_memory_mib.copy()
    decision = make_placer(ledger, policy).place(shared(memory=6000, count=2, core=20))
    assert isinstance(decision, Placement)
    allocation = decision.allocation
    assert allocation.node_name == "n0"  # n1 has only one GPU with 6000 MiB free
    assert len(set(allocation.gpu_indices)) == 2
    for gpu_share in allocation.gpu_shares:
        assert gpu_share.memory_mib == 6000
        assert gpu_share.core_percent == 20
        assert not gpu_share.exclusive
        assert gpu_share.uuid == f"n0-gpu{gpu_share.index}"
    after = ledger.gpu_free_memory_mib
    assert int((before - after).sum()) == 12000
    assert sorted(np.flatnonzero(before[0] - after[0]).tolist()) == sorted(allocation.gpu_indices)


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_exclusive_takes_only_fully_free_gpus(policy: str) -> None:
    ledger = Ledger([make_node("n0"), make_node("n1", gpus=1)])
    hold(ledger, "n0", {0: 1000}, core=5)
    hold(ledger, "n1", {0: 1000}, core=5)
    placer = make_placer(ledger, policy)
    decision = placer.place(Request("x", cpu_milli=1000, gpu_count=1, exclusive=True))
    assert chosen(decision) == ("n0", (1,))
    (gpu_share,) = decision.allocation.gpu_shares
    assert gpu_share == GpuShare(
        uuid="n0-gpu1", index=1, memory_mib=GPU_MIB, core_percent=FULL_CORE_PERCENT, exclusive=True
    )
    assert ledger.gpu_exclusive[0, 1]
    # Nothing else goes onto the exclusive GPU, however small.
    small = placer.place(shared("s", memory=1, core=0))
    assert chosen(small)[1] == (0,)
    again = placer.decide(Request("y", gpu_count=1, exclusive=True))
    assert isinstance(again, NoFit)
    assert again.message() == "0/2 nodes are available: 2 0 whole free GPU(s), need 1."


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_gpu_held_exclusively_is_never_chosen(policy: str) -> None:
    ledger = Ledger([make_node("n0")])
    gpu = ledger.nodes[0].gpus[0]
    whole = GpuShare(gpu.uuid, 0, gpu.memory_mib, FULL_CORE_PERCENT, exclusive=True)
    ledger.reserve(Allocation("x", "n0", cpu_milli=0, memory_mib=0, gpu_shares=(whole,)))
    hold(ledger, "n0", {1: 8000})
    placer = make_placer(ledger, policy)
    request = shared(memory=4000, core=0)
    assert placer.eligible_gpus(request).tolist() == [[False, True]]
    decision = placer.place(request)
    assert chosen(decision) == ("n0", (1,))
    assert ledger.gpu_sharers[0].tolist() == [1, 2]


def test_ledger_refuses_an_exclusive_share_smaller_than_the_gpu() -> None:
    ledger = Ledger([make_node("n0")])
    partial = GpuShare("n0-gpu0", 0, 1000, FULL_CORE_PERCENT, exclusive=True)
    with pytest.raises(CapacityError, match="exclusive share must hold the whole GPU"):
        ledger.reserve(Allocation("x", "n0", cpu_milli=0, memory_mib=0, gpu_shares=(partial,)))


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_exclusive_multi_gpu_needs_whole_gpus_on_one_node(policy: str) -> None:
    ledger = Ledger([make_node("n0"), make_node("n1"), make_node("n2", gpus=3)])
    hold(ledger, "n0", {0: 1000})
    hold(ledger, "n2", {1: 1000})
    decision = make_placer(ledger, policy).place(Request("x", gpu_count=2, exclusive=True))
    node, indices = chosen(decision)
    assert (node, tuple(sorted(indices))) in {("n1", (0, 1)), ("n2", (0, 2))}
    assert all(s.exclusive and s.memory_mib == GPU_MIB for s in decision.allocation.gpu_shares)


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_allowed_models(policy: str) -> None:
    ledger = Ledger([make_node("n0", model="A10"), make_node("n1", model=("A10", "A100"))])
    placer = make_placer(ledger, policy)
    request = shared(allowed_models=frozenset({"A100"}))
    assert chosen(placer.decide(request)) == ("n1", (1,))
    a10 = placer.decide(shared(allowed_models=frozenset({"A10"})))
    node, (index,) = chosen(a10)
    assert ledger.nodes[ledger.node_index[node]].gpus[index].model == "A10"
    nowhere = placer.decide(shared(allowed_models=frozenset({"H100"})))
    assert isinstance(nowhere, NoFit)
    assert nowhere.message() == (
        "0/2 nodes are available: 1 GPU model A10 not allowed, 1 GPU model A10|A100 not allowed."
    )


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_cpu_only_request(policy: str) -> None:
    ledger = Ledger([make_node("n0", cpu=1000), make_node("cpu", gpus=0, cpu=4000)])
    before = ledger.gpu_free_memory_mib.copy()
    decision = make_placer(ledger, policy).place(Request("c", cpu_milli=3000, memory_mib=2048))
    assert chosen(decision) == ("cpu", ())
    assert ledger.cpu_free_milli.tolist() == [1000, 1000]
    assert ledger.memory_free_mib.tolist() == [128 * GIB, 126 * GIB]
    np.testing.assert_array_equal(ledger.gpu_free_memory_mib, before)


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_cpu_only_request_may_use_gpu_node(policy: str) -> None:
    ledger = Ledger([make_node("n0"), make_node("n1")])
    decision = make_placer(ledger, policy).place(Request("c", cpu_milli=3000))
    node, indices = chosen(decision)
    assert indices == ()
    assert int(ledger.cpu_free_milli[ledger.node_index[node]]) == 29000
    assert int(ledger.gpu_sharers.sum()) == 0


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_unhealthy_gpu_is_not_used(policy: str) -> None:
    ledger = Ledger([make_node("n0"), make_node("n1")])
    ledger.set_gpu_health("n0", 0, False)
    ledger.set_gpu_health("n1", 0, False)
    ledger.set_gpu_health("n1", 1, False)
    decision = make_placer(ledger, policy).decide(shared())
    assert chosen(decision) == ("n0", (1,))


# -- node and GPU policies combined ----------------------------------------------------------


@pytest.mark.parametrize(
    ("node_policy", "gpu_policy", "expected"),
    [
        ("binpack", None, ("n0", (1,))),
        ("binpack", "spread", ("n0", (0,))),
        ("spread", None, ("n1", (1,))),
        ("spread", "binpack", ("n1", (0,))),
    ],
)
def test_node_and_gpu_policy_combination(node_policy, gpu_policy, expected) -> None:
    ledger = Ledger([make_node("n0"), make_node("n1")])
    hold(ledger, "n0", {0: 8000, 1: 10000})  # free 8000 and 6000
    hold(ledger, "n1", {0: 4000})  # free 12000 and 16000
    placer = Placer(ledger, node_policy, gpu_policy, seed=0)
    assert chosen(placer.decide(shared(memory=4000))) == expected


def test_fgd_gpu_half_with_other_node_half() -> None:
    ledger = four_gpu_node()
    placer = Placer(ledger, "binpack", "fgd", workload=HALF_GPU_WORKLOAD)
    assert chosen(placer.decide(shared(memory=6000))) == ("n0", (2,))


# -- policy names ----------------------------------------------------------------------------


def test_unknown_node_policy_lists_known_names() -> None:
    ledger = identical_cluster()
    known = ", ".join(sorted(POLICIES))
    with pytest.raises(PolicyError) as error:
        Placer(ledger, "nope", workload=HALF_GPU_WORKLOAD)
    assert str(error.value) == f"unknown policy 'nope' (known: {known})"


def test_unknown_gpu_policy_lists_known_names() -> None:
    with pytest.raises(PolicyError, match=r"unknown policy 'tightest' \(known: .*binpack"):
        Placer(identical_cluster(), "binpack", "tightest")


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_workload_needed_only_where_declared(policy: str) -> None:
    ledger = identical_cluster()
    if POLICIES[policy].needs_workload:
        with pytest.raises(PolicyError, match=rf"policy {policy}/{policy} needs a target"):
            Placer(ledger, policy)
        with pytest.raises(PolicyError, match=rf"policy binpack/{policy} needs a target"):
            Placer(ledger, "binpack", policy)
    else:
        assert isinstance(Placer(ledger, policy).decide(shared()), Placement)


def test_every_policy_is_named_by_its_key() -> None:
    for name, policy in POLICIES.items():
        assert policy.name == name


# -- decide, place and candidates ------------------------------------------------------------


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_decide_commits_nothing_and_place_commits(policy: str) -> None:
    ledger = graded_cluster()
    before = ledger.gpu_free_memory_mib.copy()
    placer = make_placer(ledger, policy)
    decision = placer.decide(shared("d"))
    assert isinstance(decision, Placement)
    np.testing.assert_array_equal(ledger.gpu_free_memory_mib, before)
    assert not ledger.holds("d")
    placed = make_placer(ledger, policy).place(shared("d"))
    assert isinstance(placed, Placement)
    assert ledger.allocation("d") == placed.allocation
    assert placed.node_index == ledger.node_index[placed.allocation.node_name]


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_candidates_restrict_the_choice(policy: str) -> None:
    ledger = graded_cluster()
    placer = make_placer(ledger, policy)
    assert chosen(placer.decide(shared(), candidates=np.array([1])))[0] == "n1"
    hold(ledger, "n1", {0: 10000, 1: 10000})
    nofit = placer.decide(shared(), candidates=np.array([1]))
    assert isinstance(nofit, NoFit)
    assert nofit.node_count == 1
    assert nofit.message() == (
        "0/1 nodes are available: 1 no GPU with 8000 MiB free (largest free: 6000 MiB on GPU 1)."
    )


# -- reasons for not fitting -----------------------------------------------------------------


def gib_node(name: str, indices: tuple[int, ...] = (2, 3), **kw) -> Node:
    return make_node(name, indices=indices, gpu_mib=16 * GIB, **kw)


def gib_request(gib: int, **kw) -> Request:
    return shared(memory=gib * GIB, **kw)


def test_reason_no_gpu_with_enough_memory() -> None:
    ledger = Ledger([gib_node("n0")])
    hold(ledger, "n0", {2: 12 * GIB, 3: 8 * GIB})
    placer = make_placer(ledger, "binpack")
    request = gib_request(12)
    expected = "no GPU with 12 GiB free (largest free: 8 GiB on GPU 3)"
    assert placer.reason(request, 0) == expected
    decision = placer.decide(request)
    assert isinstance(decision, NoFit)
    assert decision.reasons == {expected: 1}
    assert decision.message() == f"0/1 nodes are available: 1 {expected}."
    assert placer.no_fit(request).message() == decision.message()


def test_reason_sizes_in_mib_when_not_whole_gib() -> None:
    ledger = Ledger([gib_node("n0")])
    hold(ledger, "n0", {2: 16 * GIB, 3: 16 * GIB - 1500})
    reason = make_placer(ledger, "binpack").reason(shared(memory=12000), 0)
    assert reason == "no GPU with 12000 MiB free (largest free: 1500 MiB on GPU 3)"


def test_reason_core() -> None:
    ledger = Ledger([gib_node("n0")])
    hold(ledger, "n0", {2: 1 * GIB, 3: 1 * GIB}, core=60)
    assert make_placer(ledger, "binpack").reason(gib_request(4, core=50), 0) == (
        "no GPU with 50% core free"
    )


def test_reason_multi_gpu_shared() -> None:
    ledger = Ledger([gib_node("n0")])
    hold(ledger, "n0", {2: 12 * GIB})
    assert make_placer(ledger, "binpack").reason(gib_request(8, count=2), 0) == (
        "1 GPU(s) with 8 GiB free, need 2"
    )


def test_reason_exclusive() -> None:
    ledger = Ledger([gib_node("n0")])
    hold(ledger, "n0", {3: 1})
    request = Request("x", gpu_count=2, exclusive=True)
    assert make_placer(ledger, "binpack").reason(request, 0) == "1 whole free GPU(s), need 2"


def test_reason_model_not_allowed() -> None:
    ledger = Ledger([gib_node("n0", model="A10")])
    request = gib_request(1, allowed_models=frozenset({"A100", "H100"}))
    assert make_placer(ledger, "binpack").reason(request, 0) == "GPU model A10 not allowed"


def test_reason_cpu_comes_first() -> None:
    ledger = Ledger([gib_node("n0", model="A10", cpu=4000)])
    request = gib_request(20, cpu=8000, allowed_models=frozenset({"A100"}))
    assert make_placer(ledger, "binpack").reason(request, 0) == (
        "insufficient CPU (need 8000m, free 4000m)"
    )


def test_reason_host_memory() -> None:
    ledger = Ledger([gib_node("n0", memory=64 * GIB)])
    hold(ledger, "n0", memory=32 * GIB)
    request = Request("c", memory_mib=64 * GIB)
    assert make_placer(ledger, "binpack").reason(request, 0) == (
        "insufficient memory (need 64 GiB, free 32 GiB)"
    )


def test_reason_no_gpu_on_cpu_node() -> None:
    ledger = Ledger([make_node("cpu", gpus=0)])
    placer = make_placer(ledger, "binpack")
    assert placer.reason(gib_request(1), 0) == "no GPU"
    assert placer.reason(Request("c", cpu_milli=1000), 0) is None


def test_reason_none_when_it_fits() -> None:
    ledger = Ledger([gib_node("n0")])
    assert make_placer(ledger, "binpack").reason(gib_request(16), 0) is None


def test_reason_unhealthy_gpus_count_as_nothing_free() -> None:
    ledger = Ledger([gib_node("n0")])
    hold(ledger, "n0", {3: 12 * GIB})
    ledger.set_gpu_health("n0", 2, False)
    assert make_placer(ledger, "binpack").reason(gib_request(8), 0) == (
        "no GPU with 8 GiB free (largest free: 4 GiB on GPU 3)"
    )


def test_reason_largest_free_counts_only_allowed_models() -> None:
    # GPU 2 (A10, idle) is not allowed; the allowed GPU 3 (A100) has only 8 GiB free. The
    # reason is memory on the allowed GPU, not core.
    ledger = Ledger([gib_node("n0", model=("A10", "A100"))])
    hold(ledger, "n0", {3: 8 * GIB})
    request = gib_request(12, allowed_models=frozenset({"A100"}))
    assert make_placer(ledger, "binpack").reason(request, 0) == (
        "no GPU with 12 GiB free (largest free: 8 GiB on GPU 3)"
    )


def test_no_fit_message_counts_and_orders_reasons() -> None:
    ledger = Ledger(
        [
            gib_node("n0", cpu=4000),
            gib_node("n1", model="A10"),
            gib_node("n2", cpu=4000),
        ]
    )
    request = gib_request(4, cpu=8000, allowed_models=frozenset({"A100"}))
    for policy in ALL_POLICIES:
        decision = make_placer(ledger, policy).decide(request)
        assert isinstance(decision, NoFit)
        assert decision.node_count == 3
        assert decision.reasons == {
            "insufficient CPU (need 8000m, free 4000m)": 2,
            "GPU model A10 not allowed": 1,
        }
        assert decision.message() == (
            "0/3 nodes are available: 2 insufficient CPU (need 8000m, free 4000m), "
            "1 GPU model A10 not allowed."
        )


def test_no_fit_message_breaks_count_ties_by_reason() -> None:
    no_fit = NoFit({"zeta": 1, "alpha": 1, "mid": 2}, 4)
    assert no_fit.message() == "0/4 nodes are available: 2 mid, 1 alpha, 1 zeta."


def test_no_fit_without_explanation() -> None:
    ledger = Ledger([gib_node("n0"), gib_node("n1"), gib_node("n2")])
    decision = make_placer(ledger, "binpack").decide(gib_request(17), explain=False)
    assert decision == NoFit({}, 3)


def test_no_fit_on_a_subset_reports_fits_for_feasible_nodes() -> None:
    ledger = Ledger([gib_node("n0"), gib_node("n1", cpu=500)])
    no_fit = make_placer(ledger, "binpack").no_fit(gib_request(1))
    assert no_fit.reasons == {"fits": 1, "insufficient CPU (need 1000m, free 500m)": 1}
