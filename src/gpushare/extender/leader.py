"""Leader election for extender replicas, on a coordination.k8s.io/v1 Lease.

Each replica runs a ``LeaderElector``: every ``retry_period_s`` it reads the Lease
(``gpushare-extender`` in ``kube-system`` by default) and, if it holds it, renews it; if
nobody holds it, or the holder has not renewed it for ``leaseDurationSeconds`` as this
replica's own clock measures, it takes it. Every write is a replace carrying the
resourceVersion it read (a create when there is no Lease), so of two replicas writing at once
the API server lets one through and answers the other 409 Conflict.

Two replicas never both believe they lead (the scheme of client-go's leaderelection):

- the leader believes it leads until ``renew_deadline_s`` after the *start* of its last
  successful write;
- another replica takes over only once the Lease has stayed unchanged (same
  resourceVersion) for ``leaseDurationSeconds`` since it *observed* that version, which is
  after the leader's write started. With ``renew_deadline_s < lease duration`` the old
  leader's belief has ended before anyone else can write (clocks must run at about the same
  rate; they need not agree).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from lightkube import ApiError, Client
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

log = logging.getLogger("gpushare.extender")

LEASE_NAME = "gpushare-extender"
LEASE_NAMESPACE = "kube-system"
LEASE_DURATION_S = 15
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 5.0


def default_identity() -> str:
    """$POD_NAME (set it from the downward API), else host name and a random suffix."""
    name = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{name}_{uuid.uuid4().hex[:8]}"


class LeaderElector:
    def __init__(
        self,
        client: Client,
        identity: str | None = None,
        namespace: str = LEASE_NAMESPACE,
        name: str = LEASE_NAME,
        lease_duration_s: int = LEASE_DURATION_S,
        renew_deadline_s: float = RENEW_DEADLINE_S,
        retry_period_s: float = RETRY_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("need 0 < retry period < renew deadline < lease duration")
        self.client = client
        self.identity = identity or default_identity()
        self.namespace = namespace
        self.name = name
        self.lease_duration_s = int(lease_duration_s)
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.clock = clock
        self.changed = threading.Condition()  # notified when is_leader may have changed
        self._leading_until = float("-inf")
        self._observed_version: str | None = None
        self._observed_at = float("-inf")
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self.clock() < self._leading_until

    def wait_for(self, leading: bool, timeout: float) -> bool:
        """Wait until ``is_leader == leading``; False if ``timeout`` passes first."""
        deadline = self.clock() + timeout
        with self.changed:
            while self.is_leader != leading:
                left = deadline - self.clock()
                if left <= 0:
                    return False
                # Leadership also ends by the clock alone: look again when it would.
                if self.is_leader:
                    left = min(left, self._leading_until - self.clock() + 0.01)
                self.changed.wait(max(left, 0.001))
            return True

    def _set_leading_until(self, value: float) -> None:
        was = self.is_leader
        with self.changed:
            self._leading_until = value
            self.changed.notify_all()
        if self.is_leader != was:
            log.info(
                "%s %s leadership of lease %s/%s",
                self.identity,
                "took" if not was else "lost",
                self.namespace,
                self.name,
            )

    def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, take or renew it if allowed. True if now leading."""
        started = self.clock()
        now = datetime.datetime.now(datetime.UTC)
        try:
            lease = self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            lease = None
        if lease is None:
            fresh = Lease(
                metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                spec=LeaseSpec(
                    holderIdentity=self.identity,
                    leaseDurationSeconds=self.lease_duration_s,
                    acquireTime=now,
                    renewTime=now,
                    leaseTransitions=0,
                ),
            )
            return self._write(lambda: self.client.create(fresh), started)
        version = lease.metadata.resourceVersion if lease.metadata else None
        if version != self._observed_version:
            self._observed_version = version
            self._observed_at = started
        spec = lease.spec or LeaseSpec()
        holder = spec.holderIdentity or ""
        duration = spec.leaseDurationSeconds or self.lease_duration_s
        mine = holder == self.identity
        if holder and not mine and started < self._observed_at + duration:
            self._set_leading_until(float("-inf"))
            return False
        lease.spec = LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=self.lease_duration_s,
            acquireTime=spec.acquireTime if mine and spec.acquireTime else now,
            renewTime=now,
            leaseTransitions=(spec.leaseTransitions or 0) + (0 if mine else 1),
        )
        # replace() sends the resourceVersion read above: a write by anyone since is a 409.
        return self._write(lambda: self.client.replace(lease), started)

    def _write(self, call: Callable[[], Any], started: float) -> bool:
        try:
            written = call()
        except ApiError as error:
            if error.status.code != 409:
                raise
            log.debug("lease %s/%s: lost a race to write it", self.namespace, self.name)
            if not self.is_leader:
                return False
            # Someone else wrote it: we may have lost it; the next round reads it again.
            self._set_leading_until(float("-inf"))
            return False
        self._observed_version = written.metadata.resourceVersion if written.metadata else None
        self._observed_at = started
        self._set_leading_until(started + self.renew_deadline_s)
        return True

    def release(self) -> None:
        """Give the Lease up (on a clean stop) so that another replica takes it at once."""
        if not self.is_leader:
            return
        self._set_leading_until(float("-inf"))
        try:
            lease = self.client.get(Lease, self.name, namespace=self.namespace)
            if lease.spec is None or lease.spec.holderIdentity != self.identity:
                return
            lease.spec.holderIdentity = None
            lease.spec.leaseDurationSeconds = 1
            self.client.replace(lease)
        except Exception as error:
            log.info("lease %s/%s: could not release it: %s", self.namespace, self.name, error)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as error:
                log.warning("lease %s/%s: %s", self.namespace, self.name, error)
            with self.changed:
                self.changed.notify_all()
            self._stopping.wait(self.retry_period_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-elect", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop renewing (and, with ``release``, give the Lease up)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        if release:
            self.release()
