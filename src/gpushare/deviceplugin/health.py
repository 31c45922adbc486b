"""GPU health from NVML events: the rule (pure) and the thread that feeds it.

The rule, after NVIDIA's k8s-device-plugin: an ``nvmlEventTypeXidCriticalError`` event marks
its GPU unhealthy unless the Xid is one that an application causes (13 graphics engine
exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video
decoder exception, 109 context switch timeout): those say a program failed, not the GPU. An
event that names no GPU marks every GPU unhealthy. Unlike NVIDIA's plugin (which keeps a GPU
unhealthy until it restarts), a GPU comes back: once ``recovery_s`` have passed since its last
critical Xid, it is probed on every turn of the monitor, and it is healthy again when NVML
answers for it (its memory can be read, so it has not fallen off the bus) and no page
retirement is pending (the state a double-bit ECC error leaves until the GPU is reset).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml

log = logging.getLogger("gpushare.deviceplugin")

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_RECOVERY_S = 60.0
DEFAULT_WAIT_MS = 500


@dataclass
class HealthTracker:
    """Each GPU's health under the rule above; every method takes the time, none reads it."""

    uuids: Iterable[str]
    recovery_s: float = DEFAULT_RECOVERY_S
    ignored_xids: frozenset[int] = APPLICATION_XIDS
    _failed_at: dict[str, float] = field(default_factory=dict)  # last critical Xid, if unhealthy

    def __post_init__(self) -> None:
        self.uuids = tuple(self.uuids)

    def healthy(self) -> dict[str, bool]:
        return {uuid: uuid not in self._failed_at for uuid in self.uuids}

    def xid(self, uuid: str | None, xid: int, now: float) -> bool:
        """An Xid event on ``uuid`` (None: no GPU named); True if some GPU's health changed."""
        if xid in self.ignored_xids:
            return False
        targets = self.uuids if uuid is None else (uuid,)
        changed = False
        for target in targets:
            if target in self.uuids:
                changed |= target not in self._failed_at
                self._failed_at[target] = now
        return changed

    def due_for_probe(self, now: float) -> list[str]:
        """Unhealthy GPUs whose last critical Xid is ``recovery_s`` old: probe them."""
        return [u for u, at in self._failed_at.items() if now - at >= self.recovery_s]

    def probed(self, uuid: str, ok: bool) -> bool:
        """The result of probing ``uuid``; True if it is healthy again."""
        if ok and uuid in self._failed_at:
            del self._failed_at[uuid]
            return True
        return False


def probe(uuid: str) -> bool:
    """NVML answers for the GPU and it needs no reset (no page retirement pending)."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError:
        return False
    try:
        pending = pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    except pynvml.NVMLError_NotSupported:
        return True  # no ECC page retirement on this GPU
    except pynvml.NVMLError:
        return False
    return pending == pynvml.NVML_FEATURE_DISABLED


def _uuid_of(device: Any) -> str | None:
    if not device:
        return None
    try:
        uuid = pynvml.nvmlDeviceGetUUID(device)
    except pynvml.NVMLError:
        return None
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


class HealthMonitor:
    """A thread waiting on NVML Xid events; calls ``on_change(healthy)`` when health changes."""

    def __init__(
        self,
        tracker: HealthTracker,
        on_change: Callable[[dict[str, bool]], None],
        wait_ms: int = DEFAULT_WAIT_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tracker = tracker
        self.on_change = on_change
        self.wait_ms = wait_ms
        self.clock = clock
        self.stopping = threading.Event()
        self.registered = threading.Event()  # set once the event set is listening
        self.events = 0  # Xid events received (for logs and tests)
        self.probes = 0  # probes of unhealthy GPUs made
        self.thread = threading.Thread(target=self._run, name="gpu-health", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=self.wait_ms / 1000 + 5)

    def _register(self) -> Any:
        event_set = pynvml.nvmlEventSetCreate()
        for uuid in self.tracker.uuids:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
            wanted = supported & pynvml.nvmlEventTypeXidCriticalError
            if wanted:
                pynvml.nvmlDeviceRegisterEvents(handle, wanted, event_set)
            else:
                log.warning("GPU %s: no Xid events; its health is not watched", uuid)
        return event_set

    def _run(self) -> None:
        try:
            event_set = self._register()
        except pynvml.NVMLError as error:
            log.error("NVML events unavailable (%s); GPU health is not watched", error)
            self.registered.set()
            return
        self.registered.set()
        try:
            while not self.stopping.is_set():
                changed = False
                try:
                    event = pynvml.nvmlEventSetWait(event_set, self.wait_ms)
                except pynvml.NVMLError_Timeout:
                    event = None
                except pynvml.NVMLError as error:
                    log.warning("NVML event wait failed: %s", error)
                    self.stopping.wait(self.wait_ms / 1000)
                    event = None
                if event is not None and event.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    self.events += 1
                    uuid = _uuid_of(event.device)
                    xid = int(event.eventData)
                    if self.tracker.xid(uuid, xid, self.clock()):
                        log.error("GPU %s: Xid %d; marked unhealthy", uuid or "(all)", xid)
                        changed = True
                    elif xid in self.tracker.ignored_xids:
                        log.info("GPU %s: Xid %d (an application error)", uuid, xid)
                for uuid in self.tracker.due_for_probe(self.clock()):
                    self.probes += 1
                    if self.tracker.probed(uuid, probe(uuid)):
                        log.warning("GPU %s: healthy again", uuid)
                        changed = True
                if changed:
                    self.on_change(self.tracker.healthy())
        finally:
            with contextlib.suppress(pynvml.NVMLError):  # NVML already shut down
                pynvml.nvmlEventSetFree(event_set)
