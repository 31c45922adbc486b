"""What a pod holds in the ledger: its app containers' shares, and what its init containers add.

Kubernetes runs a pod's regular init containers one at a time, each to completion, before any
app container starts, so a pod needs at any moment either one init container's resources or
all its app containers' together: its effective request is max(largest init, sum of apps)
(the same rule kube-scheduler applies to CPU and memory). On a GPU that becomes, per GPU, the
larger of the app containers' total share and the largest init container share on it.

The ledger holds each app container's allocation under its own name and one more allocation,
named ``<namespace>/<pod>/(init)``, with whatever the init containers need beyond the app
shares on each GPU (nothing when they fit inside them: the common case of an init container
preparing data with the slice its app container will use). Sidecars (init containers with
``restartPolicy: Always``) run beside the app containers and count as app containers.

The annotation keeps every container's own share (the device plugin hands each container
exactly that); only the ledger's charge follows the max rule, and it is recomputed the same way
from the annotation after a restart.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpushare.model.types import FULL_CORE_PERCENT, Allocation, GpuShare

INIT_CHARGE_NAME = "(init)"  # not a valid container name, so it cannot clash with one


def init_charge_name(key: str) -> str:
    return f"{key}/{INIT_CHARGE_NAME}"


def init_excess(
    key: str, node: str, apps: Mapping[str, Allocation], inits: Mapping[str, Allocation]
) -> Allocation | None:
    """The allocation holding what ``inits`` need beyond ``apps`` on each GPU, or None.

    Memory and core are maximised separately over the init containers, which can only
    over-count (never under-count) when two init containers peak on different dimensions.
    """
    app_memory: dict[int, int] = {}
    app_core: dict[int, int] = {}
    app_exclusive: set[int] = set()
    for allocation in apps.values():
        for share in allocation.gpu_shares:
            app_memory[share.index] = app_memory.get(share.index, 0) + share.memory_mib
            app_core[share.index] = app_core.get(share.index, 0) + share.core_percent
            if share.exclusive:
                app_exclusive.add(share.index)
    need_memory: dict[int, int] = {}
    need_core: dict[int, int] = {}
    exclusive_need: dict[int, GpuShare] = {}  # an init container's whole-GPU share
    uuids: dict[int, str] = {}
    for allocation in inits.values():
        for share in allocation.gpu_shares:
            uuids[share.index] = share.uuid
            need_memory[share.index] = max(need_memory.get(share.index, 0), share.memory_mib)
            need_core[share.index] = max(need_core.get(share.index, 0), share.core_percent)
            if share.exclusive:
                exclusive_need[share.index] = share
    shares: list[GpuShare] = []
    for index in sorted(uuids):
        if index in app_exclusive:
            continue  # the pod holds the whole GPU already
        if index in exclusive_need and index not in app_memory:
            shares.append(exclusive_need[index])
            continue
        if index in exclusive_need:
            # The app containers share this GPU with nobody but the pod's init container:
            # hold the rest of it, so no other pod's share lands there meanwhile.
            memory = exclusive_need[index].memory_mib - app_memory[index]
            core = FULL_CORE_PERCENT - app_core[index]
        else:
            memory = need_memory[index] - app_memory.get(index, 0)
            core = need_core[index] - app_core.get(index, 0)
        memory, core = max(memory, 0), max(core, 0)
        if memory or core:
            shares.append(GpuShare(uuids[index], index, memory, core))
    if not shares:
        return None
    return Allocation(init_charge_name(key), node, 0, 0, tuple(shares))


def pod_charges(
    key: str, node: str, containers: Mapping[str, Allocation], init_names: frozenset[str]
) -> dict[str, Allocation]:
    """The ledger entries of a pod whose containers hold ``containers``: apps, then inits."""
    apps = {name: a for name, a in containers.items() if name not in init_names}
    inits = {name: a for name, a in containers.items() if name in init_names}
    charges = dict(apps)
    excess = init_excess(key, node, apps, inits)
    if excess is not None:
        charges[INIT_CHARGE_NAME] = excess
    return charges
