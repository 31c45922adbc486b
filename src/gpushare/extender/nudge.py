"""Telling kube-scheduler that GPU capacity came free, once the extender's cache has it.

kube-scheduler retries a pod the extender refused on the next cluster event (a pod deleted, a
node changed). When a deleted pod's event reaches kube-scheduler before it reaches this
extender's cache, that retry is refused again for a share the cache still counts, and the pod
waits for some later event, up to kube-scheduler's 5-minute flush. So when the cache lets a
share go, and the extender refused a pod for lack of room not long before, it writes the
node annotation ``gpushare.io/capacity-freed`` (an UpdateNodeAnnotation event, which requeues
pods an extender refused). By then the cache has the share back, so the retry can succeed.

Writes are coalesced: one patch per node per batch, from one background thread, never from
the watch thread that frees the share; nothing is written when no pod is waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpushare import protocol

log = logging.getLogger("gpushare.extender")

# kube-scheduler keeps a refused pod among its unschedulable pods for at most 5 minutes.
REFUSAL_MEMORY_S = 300.0

NodeAnnotator = Callable[[str, dict[str, str]], None]


class CapacityNudger:
    def __init__(
        self,
        annotate_node: NodeAnnotator,
        is_leader: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.annotate_node = annotate_node
        self.is_leader = is_leader
        self.clock = clock
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._last_refusal: float | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capacity-nudger", daemon=True)
        self.nudges = 0  # annotations written (for tests and logs)

    def refused(self) -> None:
        """A pod got no node for lack of GPU room (filter's answer)."""
        with self._lock:
            self._last_refusal = self.clock()

    def freed(self, node: str) -> None:
        """The cache let a share on ``node`` go; cheap, called under the cache's lock."""
        with self._lock:
            last = self._last_refusal
            if last is None or self.clock() - last > REFUSAL_MEMORY_S:
                return
            self._pending.add(node)
        self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def flush(self) -> None:
        """Write the pending annotations now (the thread's step)."""
        with self._lock:
            nodes, self._pending = self._pending, set()
        if self.is_leader is not None and not self.is_leader():
            return  # the leader's own cache decides; a follower's refusals are not answers
        for node in sorted(nodes):
            try:
                self.annotate_node(node, {protocol.ANNOTATION_CAPACITY_FREED: str(time.time_ns())})
                self.nudges += 1
            except Exception as error:  # the next freed share or resync tries again
                log.warning("node %s: cannot note freed GPU capacity: %s", node, error)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            if not self._stopping.is_set():
                self.flush()
