"""The heartbeat of the simulated nodes: what a kubelet does to say its node is alive.

One process for all nodes (`gpushare cluster heartbeat`, started by `up`): every
LEASE_INTERVAL_S it renews each node's Lease in kube-node-lease, and every STATUS_INTERVAL_S
it refreshes the heartbeat time of each node's conditions (Ready=True). The same intervals
as a kubelet's defaults: a lease a quarter of its 40 s duration, status once a minute.

No node-lifecycle controller runs (there is no kube-controller-manager), so nothing would
mark a node NotReady if the heartbeat stopped; it runs so that the cluster looks to every
client (and to a later controller) like one with live kubelets.

It exits by itself when the state dir is gone, so a `down` that failed halfway cannot leave
it running for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpushare import protocol
from gpushare.cluster import nodes
from gpushare.cluster.state import StateDir

LEASE_INTERVAL_S = protocol.NODE_LEASE_DURATION_S / 4
STATUS_INTERVAL_S = 60.0
CONCURRENCY = 32


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} heartbeat: {message}", file=sys.stderr, flush=True)


async def _each(names: list[str], action: Callable[[str], Awaitable[object]], what: str) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)
    failures: list[str] = []

    async def one(name: str) -> None:
        async with gate:
            try:
                await action(name)
            except (ApiError, OSError) as error:  # the apiserver may be stopping
                failures.append(f"{name}: {error}")

    await asyncio.gather(*(one(name) for name in names))
    if failures:
        _log(f"{what}: {len(failures)} of {len(names)} failed, first: {failures[0]}")


async def renew_leases(client: AsyncClient, names: list[str]) -> None:
    async def renew(name: str) -> object:
        patch = {"spec": {"holderIdentity": name, "renewTime": nodes.now_micro_time()}}
        return await client.patch(
            Lease, name, patch, namespace=protocol.NODE_LEASE_NAMESPACE, patch_type=PatchType.MERGE
        )

    await _each(names, renew, "lease renewal")


async def refresh_status(client: AsyncClient, names: list[str]) -> None:
    async def refresh(name: str) -> object:
        # Strategic merge: conditions merge by type, so only the heartbeat time changes
        # (lastTransitionTime is kept: the status itself does not change).
        now = nodes.now_time()
        patch = {
            "status": {
                "conditions": [
                    {"type": condition["type"], "lastHeartbeatTime": now}
                    for condition in nodes.conditions(now)
                ]
            }
        }
        return await client.patch(Node.Status, name, patch, patch_type=PatchType.STRATEGIC)

    await _each(names, refresh, "status update")


async def run(
    state_dir: StateDir,
    lease_interval: float = LEASE_INTERVAL_S,
    status_interval: float = STATUS_INTERVAL_S,
) -> None:
    names = state_dir.read_nodes()
    client = nodes.client_for(state_dir.kubeconfig)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    _log(f"{len(names)} nodes; leases every {lease_interval:g} s, status {status_interval:g} s")
    next_status = time.monotonic() + status_interval  # `up` has just written the status
    try:
        while not stopping.is_set() and state_dir.is_ours():
            started = time.monotonic()
            await renew_leases(client, names)
            if started >= next_status:
                await refresh_status(client, names)
                next_status = started + status_interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    stopping.wait(), max(0.0, lease_interval - (time.monotonic() - started))
                )
    finally:
        await client.close()
    _log("stopped")


def main(state_dir: Path) -> int:
    directory = StateDir(state_dir)
    if not directory.is_ours():
        print(f"gpushare cluster heartbeat: {state_dir}: no cluster here", file=sys.stderr)
        return 1
    asyncio.run(run(directory))
    return 0
