"""`gpushare cluster up|down|status`: a local Kubernetes control plane with simulated GPU nodes."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from gpushare import protocol
from gpushare.cluster import control_plane, heartbeat
from gpushare.cluster.nodes import DEFAULT_PODS_PER_NODE, NodeSpec
from gpushare.cluster.state import ClusterError, default_state_dir


def _add_state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"where the cluster keeps its files (default: {default_state_dir()})",
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "cluster",
        help="a local Kubernetes control plane with simulated GPU nodes",
        description=(
            "Run etcd, kube-apiserver and kube-scheduler on 127.0.0.1 with simulated GPU "
            "nodes (no kubelet: pods get scheduled and bound, never started)."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser(
        "up",
        help="start the control plane and the simulated nodes",
        description="Start the control plane and register simulated GPU nodes; print the "
        "kubeconfig path. Harmless if it already runs; a killed one is cleaned and restarted.",
    )
    _add_state_dir(up)
    nodes = up.add_argument_group("simulated nodes")
    nodes.add_argument("--nodes", type=int, default=4, help="how many nodes (default 4)")
    nodes.add_argument("--gpus-per-node", type=int, default=8, help="default 8")
    nodes.add_argument("--gpu-model", default="H200", help="default H200")
    nodes.add_argument(
        "--gpu-memory-gib",
        type=int,
        default=None,
        help="memory of each GPU (default: by model, e.g. H200 141, T4 16; else 16)",
    )
    nodes.add_argument("--cpu-per-node", type=int, default=64, help="CPU cores (default 64)")
    nodes.add_argument("--memory-gib-per-node", type=int, default=512, help="default 512")
    nodes.add_argument(
        "--pods-per-node", type=int, default=DEFAULT_PODS_PER_NODE, help="default 110"
    )
    nodes.add_argument("--node-prefix", default="gpu-node-", help="node name prefix")
    nodes.add_argument(
        "--node-list",
        type=Path,
        help="nodes from a CSV in the Alibaba trace format (sn,cpu_milli,memory_mib,gpu,model) "
        "instead of the options above",
    )
    up.add_argument(
        "--apiserver-port", type=int, default=0, help="kube-apiserver port (default: a free one)"
    )
    extender = up.add_mutually_exclusive_group()
    extender.add_argument(
        "--no-extender",
        dest="extender",
        action="store_false",
        help="run kube-scheduler without the gpushare extender",
    )
    extender.add_argument(
        "--extender",
        dest="extender",
        action="store_true",
        help="run kube-scheduler with the gpushare extender of "
        "deploy/scheduler/kube-scheduler-config.yaml, and start that extender "
        "(unless --extender-url names one that runs elsewhere); the default",
    )
    up.add_argument(
        "--extender-url",
        help=f"the extender's URL prefix (default http://127.0.0.1:"
        f"{protocol.EXTENDER_DEFAULT_PORT}{protocol.EXTENDER_PATH_PREFIX})",
    )
    up.add_argument("--bin-dir", type=Path, help="use etcd/kube-* from this folder")
    up.set_defaults(run=run_up, extender=True)

    down = actions.add_parser(
        "down",
        help="stop everything and delete the state dir",
        description="Stop the "
        "control plane (SIGTERM, then SIGKILL after --timeout) and delete the state dir.",
    )
    _add_state_dir(down)
    down.add_argument("--timeout", type=float, default=10.0, help="seconds before SIGKILL")
    down.set_defaults(run=run_down)

    state = actions.add_parser(
        "status",
        help="what runs where; exit status 0 only if all of it runs",
        description="Say what runs where. Exit status 0 if the cluster runs, 1 if not.",
    )
    _add_state_dir(state)
    state.set_defaults(run=run_status)

    # Started by `up`; not for people. No help= keeps it out of the action list.
    beat = actions.add_parser("heartbeat", description="renew the simulated nodes' leases")
    _add_state_dir(beat)
    beat.set_defaults(run=run_heartbeat)


def _state_dir(args: argparse.Namespace) -> Path:
    return args.state_dir if args.state_dir is not None else default_state_dir()


def _error(action: str, message: str) -> int:
    print(f"gpushare cluster {action}: error: {message}", file=sys.stderr)
    return 1


def run_up(args: argparse.Namespace) -> int:
    if not 0 <= args.apiserver_port <= 65535:
        return _error("up", f"--apiserver-port {args.apiserver_port}: not a port number")
    spec = NodeSpec(
        count=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_model=args.gpu_model,
        gpu_memory_gib=args.gpu_memory_gib,
        cpu=args.cpu_per_node,
        memory_gib=args.memory_gib_per_node,
        pods_per_node=args.pods_per_node,
        name_prefix=args.node_prefix,
        node_list=args.node_list,
    )
    try:
        info = control_plane.up(
            _state_dir(args),
            spec,
            bin_dir=args.bin_dir,
            apiserver_port=args.apiserver_port,
            extender=args.extender,
            extender_url=args.extender_url,
        )
    except ClusterError as error:
        return _error("up", str(error))
    if info.already_running:
        print(
            f"gpushare cluster: already up ({info.node_count} nodes, {info.apiserver_url}); "
            "nothing changed (use `gpushare cluster down` first to change it)"
        )
    else:
        recovered = " (replaced a stale one)" if info.recovered else ""
        print(
            f"gpushare cluster: up in {info.timings['total']:.1f} s{recovered}: "
            f"kube-apiserver {info.apiserver_url}, {info.node_count} simulated node(s)"
        )
    print(f"kubeconfig: {info.kubeconfig}")
    print(f"export KUBECONFIG={shlex.quote(str(info.kubeconfig))}")
    return 0


def run_down(args: argparse.Namespace) -> int:
    try:
        result = control_plane.down(_state_dir(args), args.timeout)
    except ClusterError as error:
        return _error("down", str(error))
    if not result.removed and not result.stopped and not result.killed:
        print(f"gpushare cluster: nothing runs in {_state_dir(args)}")
        return 0
    killed = f", {len(result.killed)} needed SIGKILL" if result.killed else ""
    print(
        f"gpushare cluster: stopped {len(result.stopped) + len(result.killed)} process(es)"
        f"{killed}; removed {_state_dir(args)}"
    )
    return 0


def run_status(args: argparse.Namespace) -> int:
    found = control_plane.status(_state_dir(args))
    if found.state is None:
        print(f"gpushare cluster: not running (no cluster in {found.state_dir})")
        return 1
    headline = "running" if found.running else "NOT running"
    print(f"gpushare cluster: {headline} (state dir {found.state_dir})")
    for name in control_plane.ALL_COMPONENTS:
        record = found.state.processes.get(name)
        if record is None and name not in control_plane.COMPONENTS:
            continue
        if record is None:
            print(f"  {name:<15} not started")
            continue
        where = f"  {record.url}" if record.url else ""
        alive = "running" if found.alive.get(name) else "DEAD"
        print(f"  {name:<15} pid {record.pid:<8} {alive}{where}  (log {record.log})")
    print(f"  {'kubeconfig':<15} {found.state.kubeconfig}")
    if found.nodes_total is not None:
        print(f"  {'nodes':<15} {found.nodes_total} ({found.nodes_ready} Ready)")
    else:
        print(f"  {'nodes':<15} {found.state.node_count} registered by up")
    if not found.running:
        dead = [name for name, alive in found.alive.items() if not alive]
        reason = f"{', '.join(dead)} not running" if dead else "kube-apiserver not ready"
        print(f"gpushare cluster: {reason}; `gpushare cluster up` cleans and restarts it")
        return 1
    return 0


def run_heartbeat(args: argparse.Namespace) -> int:
    return heartbeat.main(_state_dir(args))
