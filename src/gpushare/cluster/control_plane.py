"""`up`, `down` and `status` of a local control plane.

`up` starts, in a fresh state dir and on free 127.0.0.1 ports:

1. etcd, TLS with client certificates only (client and peer), no fsync (a throwaway store);
2. kube-apiserver: client-certificate authentication with certificates of our CA,
   ``--anonymous-auth=false``, authorization Node,RBAC (the admin is in system:masters,
   which RBAC lets do anything; the scheduler is system:kube-scheduler, bound to its roles
   by the default RBAC policy), service accounts signed with a key of the state dir;
3. kube-scheduler with the project's configuration (configs.py) and its own kubeconfig;
4. the simulated nodes (nodes.py), registered while the scheduler starts;
5. the heartbeat process (heartbeat.py) that renews the nodes' Leases.

Two admission plugins are off, because the controllers they rely on do not run (there is no
kube-controller-manager): ServiceAccount (it rejects pods until a controller has made the
namespace's "default" service account) and TaintNodesByCondition (it taints each new node
not-ready until the node-lifecycle controller removes the taint, so nothing would schedule).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node

from gpushare import protocol
from gpushare.cluster import binaries, configs, nodes, pki, processes
from gpushare.cluster.nodes import NodeSpec
from gpushare.cluster.state import (
    ClusterError,
    ClusterState,
    ProcessRecord,
    StateDir,
    locked,
)

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
ALIVE_GRACE_S = 15.0
# Start order; `down` stops in the reverse order.
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "heartbeat")
# With `up --extender` (and no --extender-url: that names an extender run elsewhere) the
# gpushare extender runs too, started before kube-scheduler, which calls it.
ALL_COMPONENTS = ("etcd", "kube-apiserver", "extender", "kube-scheduler", "heartbeat")

Say = Callable[[str], None]


def _say_stderr(message: str) -> None:
    print(f"gpushare cluster: {message}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class ClusterInfo:
    """What `up` or `status` found: where the cluster runs and how to reach it."""

    state_dir: Path
    kubeconfig: Path
    apiserver_url: str
    node_count: int
    processes: dict[str, ProcessRecord]
    already_running: bool = False
    recovered: bool = False
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class ClusterStatus:
    state_dir: Path
    state: ClusterState | None
    alive: dict[str, bool]
    ready: bool  # the apiserver answers /readyz
    nodes_total: int | None = None
    nodes_ready: int | None = None

    @property
    def running(self) -> bool:
        return (
            self.state is not None
            and set(COMPONENTS) <= set(self.alive)
            and all(self.alive.values())
            and self.ready
        )


def _admin_tls(state_dir: StateDir):
    paths = pki.load(state_dir.pki)
    return processes.tls_context(paths.ca.cert, paths.admin.cert, paths.admin.key)


def _apiserver_ready(state_dir: StateDir, state: ClusterState) -> bool:
    try:
        context = _admin_tls(state_dir)
    except OSError:
        return False
    code, _ = processes.probe(f"{state.apiserver_url}/readyz", context)
    return code == 200


def _inspect(state_dir: StateDir) -> ClusterStatus:
    state = state_dir.read_state()
    marker = str(state_dir.root)
    alive = {}
    ready = False
    if state is not None:
        alive = {
            name: processes.is_ours(record.pid, marker) for name, record in state.processes.items()
        }
        ready = alive.get("kube-apiserver", False) and _apiserver_ready(state_dir, state)
    return ClusterStatus(state_dir.root, state, alive, ready)


def _count_nodes(kubeconfig: Path) -> tuple[int, int]:
    client = Client(config=KubeConfig.from_file(kubeconfig))
    try:
        total = ready = 0
        for node in client.list(Node, labels={protocol.LABEL_SIMULATED: "true"}):
            total += 1
            conditions = (node.status.conditions or []) if node.status else []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                ready += 1
        return total, ready
    finally:
        client.close()


def status(state_dir: Path, *, count_nodes: bool = True) -> ClusterStatus:
    """What runs for the cluster in ``state_dir``; ``.running`` is True if all of it does."""
    directory = StateDir(state_dir)
    found = _inspect(directory)
    if found.ready and count_nodes and found.state is not None:
        # The count is extra: the status stands without it.
        with contextlib.suppress(Exception):
            found.nodes_total, found.nodes_ready = _count_nodes(directory.kubeconfig)
    return found


def _pids_in_stop_order(directory: StateDir) -> list[int]:
    """The running processes of ``directory``: those state.json lists, last started first,
    then any it does not list (it was lost, or `up` died halfway)."""
    marker = str(directory.root)
    state = directory.read_state()
    pids: list[int] = []
    if state is not None:
        pids = [
            state.processes[name].pid
            for name in reversed(ALL_COMPONENTS)
            if name in state.processes
        ]
    pids += [pid for pid in processes.processes_with(marker) if pid not in pids]
    return [pid for pid in pids if processes.is_ours(pid, marker)]


def _clean_stale(directory: StateDir, say: Say) -> bool:
    """Stop whatever is left of an earlier cluster in ``directory`` and delete it."""
    if not directory.exists():
        return False
    if not directory.is_ours():
        if any(directory.root.iterdir()):
            raise ClusterError(
                f"state dir {directory.root} is not empty and was not made by gpushare "
                "cluster; choose another --state-dir"
            )
        return False
    leftovers = _pids_in_stop_order(directory)
    say(
        f"found a stale cluster in {directory.root} (not all of it runs); "
        f"stopping {len(leftovers)} leftover process(es) and starting afresh"
    )
    processes.stop_in_order(leftovers, str(directory.root), STOP_TIMEOUT_S)
    directory.remove()
    return True


class _Launcher:
    """Starts the components one by one, recording each in state.json as it starts."""

    def __init__(self, directory: StateDir, state: ClusterState, tie_to_parent: bool) -> None:
        self.directory = directory
        self.state = state
        self.tie_to_parent = tie_to_parent
        self.started: dict[str, processes.subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], port: int | None, url: str | None):
        log = self.directory.logs / f"{name}.log"
        process = processes.spawn(
            argv, log, self.directory.run / f"{name}.pid", tie_to_parent=self.tie_to_parent
        )
        self.started[name] = process
        self.state.processes[name] = ProcessRecord(name, process.pid, str(log), port, url)
        self.directory.write_state(self.state)
        return process, log

    def stop_all(self) -> None:
        processes.stop_in_order(
            [p.pid for p in reversed(self.started.values())],
            str(self.directory.root),
            STOP_TIMEOUT_S,
        )
        for process in self.started.values():
            process.poll()


def _etcd_argv(bin_dir: Path, d: StateDir, paths: pki.Pki, client: int, peer: int) -> list[str]:
    client_url = f"https://127.0.0.1:{client}"
    peer_url = f"https://127.0.0.1:{peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=gpushare",
        f"--data-dir={d.etcd_data}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=gpushare={peer_url}",
        "--initial-cluster-state=new",
        f"--cert-file={paths.etcd.cert}",
        f"--key-file={paths.etcd.key}",
        f"--trusted-ca-file={paths.ca.cert}",
        "--client-cert-auth=true",
        f"--peer-cert-file={paths.etcd.cert}",
        f"--peer-key-file={paths.etcd.key}",
        f"--peer-trusted-ca-file={paths.ca.cert}",
        "--peer-client-cert-auth=true",
        # A store that `down` deletes: durability buys nothing and fsync costs seconds.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def _apiserver_argv(
    bin_dir: Path, d: StateDir, paths: pki.Pki, port: int, etcd_port: int
) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={d.run / 'apiserver'}",
        f"--etcd-servers=https://127.0.0.1:{etcd_port}",
        f"--etcd-cafile={paths.ca.cert}",
        f"--etcd-certfile={paths.etcd_client.cert}",
        f"--etcd-keyfile={paths.etcd_client.key}",
        f"--tls-cert-file={paths.apiserver.cert}",
        f"--tls-private-key-file={paths.apiserver.key}",
        f"--client-ca-file={paths.ca.cert}",
        "--anonymous-auth=false",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={paths.service_account_pub}",
        f"--service-account-signing-key-file={paths.service_account_key}",
        f"--service-cluster-ip-range={pki.SERVICE_CLUSTER_IP_RANGE}",
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        # The "kubernetes" service cannot point at 127.0.0.1 (endpoints refuse loopback).
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        "--profiling=false",
    ]


def _scheduler_argv(bin_dir: Path, d: StateDir, paths: pki.Pki, port: int) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"),
        f"--config={d.scheduler_config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={paths.scheduler_serving.cert}",
        f"--tls-private-key-file={paths.scheduler_serving.key}",
        # Loopback only: let the benchmark read kube-scheduler's own latency figures.
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        "--profiling=false",
    ]


def _extender_argv(d: StateDir, url: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gpushare.cli.main",
        "extender",
        f"--kubeconfig={d.kubeconfig}",
        f"--url={url}",
    ]


def _heartbeat_argv(d: StateDir) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gpushare.cli.main",
        "cluster",
        "heartbeat",
        f"--state-dir={d.root}",
    ]


def up(
    state_dir: Path,
    spec: NodeSpec | None = None,
    *,
    bin_dir: Path | None = None,
    apiserver_port: int = 0,
    extender: bool = False,
    extender_url: str | None = None,
    ready_timeout: float = READY_TIMEOUT_S,
    tie_to_parent: bool = False,
    say: Say = _say_stderr,
) -> ClusterInfo:
    """Start a cluster in ``state_dir``, or return the one that already runs there.

    A state dir left by a cluster that no longer runs (its processes were killed) is cleaned
    and a new cluster started. On failure every process started is stopped, the state dir
    kept for its logs, and ClusterError raised.
    """
    spec = spec or NodeSpec()
    directory = StateDir(state_dir)
    node_models = nodes.build_nodes(spec)  # a bad option or node list: fail before anything
    if apiserver_port:
        processes.check_port_free(apiserver_port, "--apiserver-port")
    with locked(directory):
        found = _inspect(directory)
        deadline = time.monotonic() + ALIVE_GRACE_S
        # Every process runs but the apiserver does not answer: it may be busy; give it time
        # rather than tear down a working cluster.
        while (
            found.state is not None
            and not found.running
            and set(COMPONENTS) <= set(found.alive)
            and all(found.alive.values())
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
            found = _inspect(directory)
        if found.running and found.state is not None:
            return ClusterInfo(
                directory.root,
                Path(found.state.kubeconfig),
                found.state.apiserver_url,
                found.state.node_count,
                found.state.processes,
                already_running=True,
            )
        bins = binaries.find_bin_dir(bin_dir)
        recovered = _clean_stale(directory, say)
        return _start(
            directory,
            bins,
            node_models,
            spec.pods_per_node,
            apiserver_port=apiserver_port,
            extender=extender,
            extender_url=extender_url,
            ready_timeout=ready_timeout,
            tie_to_parent=tie_to_parent,
            recovered=recovered,
            say=say,
        )


def _start(
    directory: StateDir,
    bin_dir: Path,
    node_models: list,
    pods_per_node: int,
    *,
    apiserver_port: int,
    extender: bool,
    extender_url: str | None,
    ready_timeout: float,
    tie_to_parent: bool,
    recovered: bool,
    say: Say,
) -> ClusterInfo:
    timings: dict[str, float] = {}
    began = time.monotonic()
    directory.create()
    paths = pki.create(directory.pki)
    api_port = apiserver_port or processes.free_port()
    etcd_port, peer_port, scheduler_port = (processes.free_port() for _ in range(3))
    api_url = f"https://127.0.0.1:{api_port}"
    configs.write_kubeconfig(directory.kubeconfig, api_url, paths.ca.cert, "admin", paths.admin)
    configs.write_kubeconfig(
        directory.scheduler_kubeconfig, api_url, paths.ca.cert, "scheduler", paths.scheduler
    )
    directory.scheduler_config.write_text(
        configs.render_scheduler_config(
            directory.scheduler_kubeconfig, extender=extender, extender_url=extender_url
        )
    )
    directory.write_nodes([node.name for node in node_models])
    state = ClusterState(
        state_dir=str(directory.root),
        kubeconfig=str(directory.kubeconfig),
        bin_dir=str(bin_dir),
        apiserver_url=api_url,
        node_count=len(node_models),
        extender=extender,
    )
    directory.write_state(state)
    timings["prepare"] = time.monotonic() - began
    launcher = _Launcher(directory, state, tie_to_parent)
    try:
        mark = time.monotonic()
        say(f"starting etcd on 127.0.0.1:{etcd_port}")
        etcd_url = f"https://127.0.0.1:{etcd_port}"
        process, log = launcher.start(
            "etcd", _etcd_argv(bin_dir, directory, paths, etcd_port, peer_port), etcd_port, etcd_url
        )
        client = paths.etcd_client
        etcd_tls = processes.tls_context(paths.ca.cert, client.cert, client.key)
        processes.wait_ready("etcd", f"{etcd_url}/health", etcd_tls, process, log, ready_timeout)
        timings["etcd"] = time.monotonic() - mark

        mark = time.monotonic()
        say(f"starting kube-apiserver on {api_url}")
        process, log = launcher.start(
            "kube-apiserver",
            _apiserver_argv(bin_dir, directory, paths, api_port, etcd_port),
            api_port,
            api_url,
        )
        admin_tls = processes.tls_context(paths.ca.cert, paths.admin.cert, paths.admin.key)
        processes.wait_ready(
            "kube-apiserver", f"{api_url}/readyz", admin_tls, process, log, ready_timeout
        )
        timings["kube-apiserver"] = time.monotonic() - mark

        if extender and extender_url is None:
            # The extender kube-scheduler's configuration names (the project's default URL).
            mark = time.monotonic()
            url = (
                f"http://127.0.0.1:{protocol.EXTENDER_DEFAULT_PORT}{protocol.EXTENDER_PATH_PREFIX}"
            )
            # No check_port_free: the extender reuses the address (a port left in TIME_WAIT
            # by a killed extender is fine) and says so itself if the port is taken.
            say(f"starting the gpushare extender on {url}")
            process, log = launcher.start(
                "extender",
                _extender_argv(directory, url),
                protocol.EXTENDER_DEFAULT_PORT,
                url,
            )
            processes.wait_ready(
                "extender",
                f"http://127.0.0.1:{protocol.EXTENDER_DEFAULT_PORT}/healthz",
                admin_tls,
                process,
                log,
                ready_timeout,
            )
            timings["extender"] = time.monotonic() - mark

        mark = time.monotonic()
        scheduler_url = f"https://127.0.0.1:{scheduler_port}"
        say(f"starting kube-scheduler on {scheduler_url}")
        scheduler, scheduler_log = launcher.start(
            "kube-scheduler",
            _scheduler_argv(bin_dir, directory, paths, scheduler_port),
            scheduler_port,
            scheduler_url,
        )
        say(f"registering {len(node_models)} simulated node(s)")
        nodes.register_nodes(directory.kubeconfig, node_models, pods_per_node)
        timings["nodes"] = time.monotonic() - mark
        scheduler_tls = processes.tls_context(paths.ca.cert)
        processes.wait_ready(
            "kube-scheduler",
            f"{scheduler_url}/readyz",
            scheduler_tls,
            scheduler,
            scheduler_log,
            ready_timeout,
        )
        timings["kube-scheduler"] = time.monotonic() - mark

        launcher.start("heartbeat", _heartbeat_argv(directory), None, None)
    except BaseException:
        launcher.stop_all()
        raise
    timings["total"] = time.monotonic() - began
    return ClusterInfo(
        directory.root,
        directory.kubeconfig,
        api_url,
        len(node_models),
        state.processes,
        recovered=recovered,
        timings=timings,
    )


@dataclass(slots=True)
class DownResult:
    stopped: list[int]  # pids that ended on SIGTERM
    killed: list[int]  # pids that needed SIGKILL
    removed: bool  # a state dir was deleted


def down(state_dir: Path, timeout: float = STOP_TIMEOUT_S) -> DownResult:
    """Stop every process of the cluster in ``state_dir`` and delete the state dir."""
    directory = StateDir(state_dir)
    with locked(directory):
        if directory.exists() and not directory.is_ours():
            raise ClusterError(
                f"{directory.root} was not made by gpushare cluster; not touching it"
            )
        marker = str(directory.root)
        pids = _pids_in_stop_order(directory)
        killed = processes.stop_in_order(pids, marker, timeout)
        removed = directory.exists()
        directory.remove()
        return DownResult([p for p in pids if p not in killed], killed, removed)
