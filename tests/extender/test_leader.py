"""Leader election on a Lease, against the API server of the extender cluster fixture."""

from __future__ import annotations

import json
import threading

import pytest
from extender_helpers import FakeBinder, args, container, node, pod
from lightkube import Client
from lightkube.resources.coordination_v1 import Lease
from test_server import call

from gpushare import protocol
from gpushare.extender.cache import ClusterCache
from gpushare.extender.leader import LeaderElector
from gpushare.extender.server import Extender, make_server, serve_in_thread

# Short durations: a lease of 2 s, believed for 1.5 s after a write, renewed every 0.2 s.
FAST = {"lease_duration_s": 2, "renew_deadline_s": 1.5, "retry_period_s": 0.2}


def elector(client: Client, namespace: str, identity: str) -> LeaderElector:
    return LeaderElector(client, identity=identity, namespace=namespace, **FAST)


def test_config_must_order_its_durations(ekube: Client) -> None:
    with pytest.raises(ValueError):
        LeaderElector(ekube, lease_duration_s=2, renew_deadline_s=3, retry_period_s=1)


def test_racing_first_writes_make_exactly_one_leader(ekube: Client, ens: str) -> None:
    a, b = elector(ekube, ens, "a"), elector(ekube, ens, "b")
    gate = threading.Barrier(2)
    results: dict[str, bool] = {}

    def step(e: LeaderElector) -> None:
        gate.wait()
        results[e.identity] = e.try_acquire_or_renew()

    threads = [threading.Thread(target=step, args=(e,)) for e in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == [False, True]
    assert [a.is_leader, b.is_leader].count(True) == 1
    leader = "a" if a.is_leader else "b"
    lease = ekube.get(Lease, "gpushare-extender", namespace=ens)
    assert lease.spec.holderIdentity == leader
    # The other cannot take it while it is fresh, and the leader renews it.
    other = b if leader == "a" else a
    assert not other.try_acquire_or_renew()
    assert (a if leader == "a" else b).try_acquire_or_renew()


def test_one_leads_and_the_other_takes_over_when_it_stops(ekube: Client, ens: str) -> None:
    a, b = elector(ekube, ens, "a"), elector(ekube, ens, "b")
    a.start()
    try:
        assert a.wait_for(True, timeout=10)
        # b's rounds while a renews: it never leads.
        for _ in range(5):
            assert not b.try_acquire_or_renew()
        assert ekube.get(Lease, "gpushare-extender", namespace=ens).spec.holderIdentity == "a"
        b.start()
        transitions = ekube.get(Lease, "gpushare-extender", namespace=ens).spec.leaseTransitions
        a.stop(release=False)  # a crash: it stops renewing and keeps the Lease
        assert b.wait_for(True, timeout=10)
        assert not a.is_leader  # a's belief ended before b could write
        lease = ekube.get(Lease, "gpushare-extender", namespace=ens)
        assert lease.spec.holderIdentity == "b"
        assert lease.spec.leaseTransitions == transitions + 1
    finally:
        a.stop(release=False)
        b.stop(release=True)
    assert not b.is_leader
    assert ekube.get(Lease, "gpushare-extender", namespace=ens).spec.holderIdentity is None


def test_released_lease_is_taken_at_once(ekube: Client, ens: str) -> None:
    a, b = elector(ekube, ens, "a"), elector(ekube, ens, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader
    assert b.try_acquire_or_renew()


def test_non_leader_answers_503_and_is_not_ready() -> None:
    cache = ClusterCache()
    cache.replace_nodes([node("n1")])
    cache.replace_pods([])
    leading = threading.Event()
    httpd = make_server(Extender(cache, FakeBinder(), leading.is_set), "127.0.0.1", 0)
    serve_in_thread(httpd)
    try:
        address = httpd.server_address[:2]
        prefix = protocol.EXTENDER_PATH_PREFIX
        body = json.dumps(args(pod("p", container(mem=4)), "n1")).encode()
        assert call(address, "GET", "/readyz") == (503, b"not leader")
        for verb in ("filter", "prioritize", "bind"):
            status, answer = call(address, "POST", f"{prefix}/{verb}", body)
            assert status == 503 and "not the leader" in json.loads(answer)["error"]
        leading.set()
        assert call(address, "GET", "/readyz") == (200, b"ok")
        status, answer = call(address, "POST", f"{prefix}/filter", body)
        assert status == 200 and json.loads(answer)["nodenames"] == ["n1"]
    finally:
        httpd.shutdown()
        httpd.server_close()
