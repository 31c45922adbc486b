"""The enforcement watchdog: stops a sharing container that stays above its GPU memory limit.

The interception library keeps cooperating programs within their slice; the watchdog is the
guarantee for one that escaped it (a static binary, a cleared LD_PRELOAD). It compares what
NVML says each container's processes hold on each of its shared GPUs with the share's memory
(``gpushare.io/allocation``); a container above it (plus a tolerance for the driver's own
per-context memory) for longer than the grace period has its GPU processes killed (SIGKILL),
so the pod fails as it would on a GPU of its own, and an Event on the pod says why.

``decide`` is the pure decision; ``Watchdog`` does the I/O. What it never does: touch a
process that NVML did not list, one whose cgroup does not name a container of a pod on this
node holding non-exclusive GPU shares, or one whose cgroup changed between the decision and
the signal (the pid is pinned with a pidfd, re-checked, then signalled through the pidfd, so a
reused pid is never hit). Exclusive containers are not watched: the GPU is theirs.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpushare.monitor.attribution import Usage, attribute
from gpushare.monitor.cgroup import ContainerRef, container_of
from gpushare.monitor.nvml import GpuSample
from gpushare.monitor.pods import MIB, Container

log = logging.getLogger("gpushare.monitor")

DEFAULT_GRACE_S = 30.0
DEFAULT_INTERVAL_S = 5.0
DEFAULT_TOLERANCE_BYTES = 256 * MIB
EVENT_REASON_STOPPED = "GPUMemoryOverLimit"

Key = tuple[str, str, str]  # pod uid, container, GPU UUID


@dataclass(frozen=True, slots=True)
class Verdict:
    """A container above its limit on one GPU."""

    container: Container
    uuid: str
    used_bytes: int
    limit_bytes: int
    over_for_s: float


@dataclass(frozen=True, slots=True)
class Decision:
    stop: tuple[Verdict, ...]  # over for longer than the grace period
    over: tuple[Verdict, ...]  # over, still within the grace period
    over_since: dict[Key, float]  # the state for the next call


def decide(
    usage: Iterable[Usage],
    over_since: Mapping[Key, float],
    now: float,
    grace_s: float,
    tolerance_bytes: int,
) -> Decision:
    """Which containers to stop now. A container must be seen over its limit at every look
    from the first to one at least ``grace_s`` later; one look under resets it."""
    stop: list[Verdict] = []
    over: list[Verdict] = []
    since: dict[Key, float] = {}
    for entry in usage:
        share = entry.container.share_on(entry.uuid)
        if share is None or share.exclusive or entry.unknown:
            continue
        limit = share.memory_mib * MIB
        if entry.used_bytes <= limit + tolerance_bytes:
            continue
        key = (entry.container.pod_uid, entry.container.name, entry.uuid)
        first = over_since.get(key, now)
        verdict = Verdict(entry.container, entry.uuid, entry.used_bytes, limit, now - first)
        if now - first >= grace_s:
            stop.append(verdict)
        else:
            over.append(verdict)
            since[key] = first
    return Decision(tuple(stop), tuple(over), since)


class EventSink(Protocol):
    """Records a Warning Event on a container's pod (kube.EventRecorder on a node)."""

    def record(self, container: Container, reason: str, message: str) -> None: ...


def kill_if_owned(proc_root: Path, pid: int, owner: ContainerRef) -> bool:
    """SIGKILL ``pid`` only if its cgroup still names ``owner``; True if signalled."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        # The pidfd pins the process: if ``pid`` is reused after this check, the signal
        # below goes to the process we checked (or fails), never to the newcomer.
        if container_of(proc_root, pid) != owner:
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def _gib(value: int) -> str:
    return f"{value / (1 << 30):.2f} GiB"


class Watchdog:
    """Looks every ``interval_s``: samples NVML, attributes, decides, stops and reports."""

    def __init__(
        self,
        sample: Callable[[], list[GpuSample]],
        containers: Callable[[], list[Container]],
        proc_root: Path,
        *,
        events: EventSink | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
        dry_run: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sample = sample
        self.containers = containers
        self.proc_root = proc_root
        self.events = events
        self.grace_s = grace_s
        self.tolerance_bytes = tolerance_bytes
        self.dry_run = dry_run
        self.clock = clock
        self._lock = threading.Lock()
        self._over_since: dict[Key, float] = {}
        self._stops: dict[tuple[str, str, str], int] = {}  # namespace, pod, container → count
        self._over: set[Key] = set()

    def stops(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._stops)

    def over(self) -> set[Key]:
        with self._lock:
            return set(self._over)

    def tick(self) -> tuple[Verdict, ...]:
        """One look; the verdicts acted on (stopped, or reported in dry-run mode)."""
        containers = self.containers()
        attribution = attribute(
            self.sample(), containers, lambda pid: container_of(self.proc_root, pid)
        )
        with self._lock:
            decision = decide(
                attribution.usage.values(),
                self._over_since,
                self.clock(),
                self.grace_s,
                self.tolerance_bytes,
            )
            self._over_since = decision.over_since
            self._over = {(v.container.pod_uid, v.container.name, v.uuid) for v in decision.over}
            self._over |= {(v.container.pod_uid, v.container.name, v.uuid) for v in decision.stop}
        done: set[tuple[str, str]] = set()
        for verdict in decision.stop:
            container = verdict.container
            if (container.pod_uid, container.name) in done:
                continue  # over on two GPUs: one stop
            done.add((container.pod_uid, container.name))
            pids = sorted(
                {
                    pid
                    for entry in attribution.usage.values()
                    if entry.container == container
                    for pid in entry.pids
                }
            )
            self._stop(verdict, pids)
        return decision.stop

    def _stop(self, verdict: Verdict, pids: list[int]) -> None:
        container = verdict.container
        figures = (
            f"container {container.name} used {_gib(verdict.used_bytes)} of GPU {verdict.uuid} "
            f"(NVML) against its limit of {_gib(verdict.limit_bytes)} for "
            f"{verdict.over_for_s:.0f} s"
        )
        if self.dry_run:
            message = f"{figures}; dry run: processes {pids} not stopped"
        else:
            assert container.container_id is not None  # attributed through it
            owner = ContainerRef(container.pod_uid, container.container_id)
            killed = [pid for pid in pids if kill_if_owned(self.proc_root, pid, owner)]
            message = f"{figures}; stopped its GPU processes {killed} (SIGKILL)"
            with self._lock:
                key = (container.namespace, container.pod, container.name)
                self._stops[key] = self._stops.get(key, 0) + 1
        log.warning("pod %s/%s: %s", container.namespace, container.pod, message)
        if self.events is not None:
            try:
                self.events.record(container, EVENT_REASON_STOPPED, message)
            except Exception as error:  # an API outage must not stop the watchdog
                log.warning(
                    "pod %s/%s: event not recorded: %s", container.namespace, container.pod, error
                )

    def run(self, stopping: threading.Event, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        while not stopping.is_set():
            try:
                self.tick()
            except Exception as error:
                log.warning("watchdog: %s", error)
            stopping.wait(interval_s)
