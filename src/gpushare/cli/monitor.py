"""`gpushare monitor`: the node agent: Prometheus metrics at /metrics and the watchdog."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from gpushare import protocol


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "monitor",
        help="the node agent: GPU and container metrics for Prometheus, and the watchdog",
        description="Serve Prometheus metrics of this node's GPUs and GPU containers at "
        "/metrics and stop containers that stay above their GPU memory limit.",
    )
    parser.add_argument(
        "--listen",
        default=f"0.0.0.0:{protocol.MONITOR_DEFAULT_PORT}",
        help="HOST:PORT (default %(default)s; port 0: any free port, logged)",
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="this node's name in Kubernetes (default: $NODE_NAME, else the host name)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="the API server (default: $KUBECONFIG, else the in-cluster service account)",
    )
    parser.add_argument(
        "--pods-file",
        type=Path,
        default=None,
        help="read the node's pods (and Node) from this JSON/YAML file instead of the API "
        "server; no Events are written",
    )
    parser.add_argument(
        "--state-root",
        type=Path,
        default=Path(protocol.HOST_STATE_ROOT),
        help="the device plugin's host state root: each container's state file is "
        "ROOT/containers/<pod uid>/<container>/state/gpushare.state (default %(default)s)",
    )
    parser.add_argument(
        "--proc-root", type=Path, default=Path("/proc"), help="the host's /proc (default /proc)"
    )
    parser.add_argument(
        "--watchdog",
        choices=("on", "dry-run", "off"),
        default="on",
        help="stop containers over their memory limit (on), only report them (dry-run), or "
        "neither (default on)",
    )
    parser.add_argument(
        "--grace", type=float, default=30.0, help="seconds over the limit before a stop (30)"
    )
    parser.add_argument(
        "--interval", type=float, default=5.0, help="seconds between watchdog looks (5)"
    )
    parser.add_argument(
        "--tolerance-mib",
        type=int,
        default=256,
        help="MiB over the limit tolerated for the driver's per-context memory (256)",
    )
    parser.add_argument("--log-level", default="INFO", help="default INFO")
    parser.set_defaults(run=run)


def parse_listen(text: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT; ValueError naming the option otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--listen {text}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _fail(message: str, status: int = 2) -> int:
    print(f"gpushare monitor: error: {message}", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from gpushare.monitor.collector import MonitorCollector
    from gpushare.monitor.nvml import NvmlError, NvmlSource
    from gpushare.monitor.pods import StaticPodSource, load_pods_file
    from gpushare.monitor.server import make_server
    from gpushare.monitor.watchdog import Watchdog

    level = logging.getLevelName(args.log_level.upper())
    if not isinstance(level, int):
        return _fail(f"--log-level {args.log_level}: expected DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        host, port = parse_listen(args.listen)
    except ValueError as error:
        return _fail(str(error))
    for option, value in (("--grace", args.grace), ("--interval", args.interval)):
        if value <= 0:
            return _fail(f"{option} {value}: must be positive")
    if args.tolerance_mib < 0:
        return _fail(f"--tolerance-mib {args.tolerance_mib}: must not be negative")
    if not args.proc_root.is_dir():
        return _fail(f"--proc-root {args.proc_root}: not a directory")
    client = None
    events = None
    if args.pods_file is not None:
        try:
            pods, node = load_pods_file(args.pods_file.read_text(), str(args.pods_file))
        except OSError as error:
            return _fail(f"--pods-file {args.pods_file}: {error.strerror}")
        except ValueError as error:
            return _fail(str(error))
        source = StaticPodSource(pods, node)
    else:
        from lightkube import Client, KubeConfig

        from gpushare.monitor.kube import EventRecorder, KubePodSource

        kubeconfig = args.kubeconfig or (
            Path(os.environ["KUBECONFIG"]) if "KUBECONFIG" in os.environ else None
        )
        try:
            config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
            client = Client(config=config, field_manager="gpushare-monitor")
        except Exception as error:
            return _fail(f"no usable kubeconfig: {error}")
        source = KubePodSource(client, args.node_name)
        source.start()
        events = EventRecorder(client, args.node_name)
    try:
        nvml = NvmlSource()
    except NvmlError as error:
        return _fail(str(error), 1)
    stopping = threading.Event()
    watchdog = None
    if args.watchdog != "off":
        watchdog = Watchdog(
            nvml.sample_memory,
            source.containers,
            args.proc_root,
            events=events,
            grace_s=args.grace,
            tolerance_bytes=args.tolerance_mib << 20,
            dry_run=args.watchdog == "dry-run",
        )
        threading.Thread(
            target=watchdog.run, args=(stopping, args.interval), name="watchdog", daemon=True
        ).start()
    registry = CollectorRegistry()
    registry.register(
        MonitorCollector(
            args.node_name,
            nvml.sample,
            source,
            state_root=args.state_root,
            proc_root=args.proc_root,
            watchdog=watchdog,
        )
    )
    try:
        server = make_server(registry, host, port)
    except OSError as error:
        return _fail(f"cannot listen on {host}:{port}: {error.strerror}", 1)

    def shutdown(*_: object) -> None:
        stopping.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    bound_port = server.server_address[1]
    logging.getLogger("gpushare.monitor").info(
        "serving http://%s:%d/metrics for node %s", host, bound_port, args.node_name
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stopping.set()
        if hasattr(source, "stop"):
            source.stop()
        server.server_close()
        nvml.close()
        if client is not None:
            client.close()
    return 0
