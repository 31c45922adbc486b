"""`gpushare device-plugin`: the kubelet device plugin for gpushare.io/* on one GPU node."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from gpushare import protocol


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "device-plugin",
        help="the kubelet device plugin: advertises the node's GPUs, serves each container "
        "its slice",
        description="Advertise gpushare.io/gpu-mem, gpu-core and gpu to kubelet and, when a "
        "container starts, give it the GPUs and limits the extender chose for it.",
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node's name (default: $NODE_NAME)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="the API server (default: $KUBECONFIG, else in-cluster or ~/.kube/config)",
    )
    parser.add_argument(
        "--memory-unit",
        choices=("GiB", "MiB"),
        default="GiB",
        help="the unit of gpushare.io/gpu-mem, as the extender's (default GiB)",
    )
    parser.add_argument(
        "--device-plugin-dir",
        type=Path,
        default=Path(protocol.KUBELET_DEVICE_PLUGIN_DIR),
        help="kubelet's device plugin directory (default %(default)s)",
    )
    parser.add_argument(
        "--device-list-strategy",
        default="envvar",
        help="how the NVIDIA container runtime is told the GPUs: envvar, volume-mounts, "
        "cdi, or cdi plus one of the others, comma-separated (default %(default)s)",
    )
    parser.add_argument(
        "--library-host-path",
        default=protocol.HOST_LIBRARY_PATH,
        help="where libgpushare.so is installed on the host (default %(default)s)",
    )
    parser.add_argument(
        "--host-state-dir",
        type=Path,
        default=Path(protocol.HOST_STATE_ROOT),
        help="where the per-container limits files and state directories live on the host "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=Path(protocol.KUBELET_POD_RESOURCES_SOCKET),
        help="kubelet's pod resources API socket, read to see which container really got "
        "which decision (default %(default)s)",
    )
    parser.add_argument(
        "--recovery-s",
        type=float,
        default=60.0,
        help="seconds after its last critical Xid before a failed GPU is probed to come back "
        "(default 60)",
    )
    parser.add_argument(
        "--ignored-xids",
        default="13,31,43,45,68,109",
        help="Xids that are application errors and leave the GPU healthy (default %(default)s)",
    )
    parser.add_argument("--log-level", default="INFO", help="default INFO")
    parser.set_defaults(run=run)


def _fail(message: str, status: int = 2) -> int:
    print(f"gpushare device-plugin: error: {message}", file=sys.stderr)
    return status


def parse_strategies(text: str) -> tuple[str, ...]:
    """The device list strategies of ``text``; ValueError naming the option if bad."""
    from gpushare.deviceplugin.response import STRATEGIES

    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in STRATEGIES]
    if not names or unknown:
        raise ValueError(
            f"--device-list-strategy {text!r}: expected some of {', '.join(STRATEGIES)}"
        )
    if {"envvar", "volume-mounts"} <= set(names):
        raise ValueError("--device-list-strategy: envvar and volume-mounts exclude each other")
    return names


def parse_xids(text: str) -> frozenset[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(part.isascii() and part.isdigit() for part in parts):
        raise ValueError(f"--ignored-xids {text!r}: expected comma-separated whole numbers")
    return frozenset(int(part) for part in parts)


def run(args: argparse.Namespace) -> int:
    from lightkube import Client, KubeConfig

    from gpushare.deviceplugin import discovery
    from gpushare.deviceplugin.health import HealthMonitor, HealthTracker
    from gpushare.deviceplugin.inventory import Inventory, InventoryError
    from gpushare.deviceplugin.kube import KubeNode
    from gpushare.deviceplugin.kubelet import Lifecycle
    from gpushare.deviceplugin.matching import DECIDING_RESOURCES
    from gpushare.deviceplugin.podresources import PodResourcesClient, Reconciler
    from gpushare.deviceplugin.service import DevicePlugin, Settings

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log = logging.getLogger("gpushare.deviceplugin")
    if not args.node_name:
        return _fail("--node-name (or $NODE_NAME) is required")
    try:
        strategies = parse_strategies(args.device_list_strategy)
        ignored = parse_xids(args.ignored_xids)
    except ValueError as error:
        return _fail(str(error))
    if args.recovery_s < 0:
        return _fail(f"--recovery-s must be >= 0, got {args.recovery_s}")
    if not args.device_plugin_dir.is_dir():
        return _fail(f"--device-plugin-dir {args.device_plugin_dir}: not a directory")
    if not Path(args.library_host_path).is_file():
        # Containers would fail to start on a mount of a missing file; say so now.
        return _fail(f"--library-host-path {args.library_host_path}: no such file")
    kubeconfig = args.kubeconfig or (
        Path(os.environ["KUBECONFIG"]) if "KUBECONFIG" in os.environ else None
    )
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
        client = Client(config=config, field_manager="gpushare-device-plugin", timeout=10)
    except Exception as error:
        return _fail(f"no usable kubeconfig: {error}")
    try:
        discovery.init_nvml()
    except discovery.DiscoveryError as error:
        return _fail(str(error), status=1)
    try:
        driver, gpus = discovery.discover()
        unit = protocol.MIB_PER_GIB if args.memory_unit == "GiB" else 1
        inventory = Inventory(tuple(gpus), unit)
    except (discovery.DiscoveryError, InventoryError) as error:
        discovery.shutdown_nvml()
        return _fail(str(error), status=1)
    log.info("driver %s, %d GPU(s) on node %s", driver, len(gpus), args.node_name)
    for gpu in gpus:
        log.info(
            "GPU %d %s %s %d MiB NUMA %d PCI %s NVLink to %s",
            gpu.index,
            gpu.uuid,
            gpu.model,
            gpu.memory_mib,
            gpu.numa,
            gpu.pci_bus_id,
            list(gpu.nvlink_peers) or "none",
        )
    node = KubeNode(client, args.node_name)
    settings = Settings(
        node=args.node_name,
        memory_mib_per_unit=unit,
        strategies=strategies,
        library_host_path=args.library_host_path,
        host_state_root=args.host_state_dir,
    )
    plugin = DevicePlugin(settings, inventory, node, node)
    tracker = HealthTracker([gpu.uuid for gpu in gpus], args.recovery_s, ignored)
    monitor = HealthMonitor(tracker, plugin.set_health)
    lifecycle = Lifecycle(plugin, args.device_plugin_dir)
    reconciler = Reconciler(
        PodResourcesClient(args.pod_resources_socket), DECIDING_RESOURCES, plugin.reconcile
    )
    plugin.on_served = reconciler.wake

    def shutdown(*_: object) -> None:
        lifecycle.stop()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    node.start()
    plugin.publish()
    monitor.start()
    reconciler.start()
    try:
        lifecycle.run()
    finally:
        reconciler.stop()
        monitor.stop()
        node.stop()
        discovery.shutdown_nvml()
        client.close()
    log.info("stopped")
    return 0
