"""Kubeconfigs and the kube-scheduler configuration of a local cluster.

The scheduler configuration lives in the project, deploy/scheduler/kube-scheduler-config.yaml,
with the gpushare extender in it. A local cluster renders it: its own kubeconfig, no leader
election (one scheduler) and, while the extender does not run, no ``extenders:`` block.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from gpushare import protocol
from gpushare.cluster.pki import KeyPair
from gpushare.cluster.state import ClusterError

REPO_ROOT = Path(__file__).resolve().parents[3]
SCHEDULER_CONFIG = REPO_ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
SCHEDULER_API_VERSION = "kubescheduler.config.k8s.io/v1"
CLUSTER_NAME = "gpushare-local"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca: Path, user: str, client: KeyPair) -> None:
    """A kubeconfig with everything inline, so that it still works when copied elsewhere."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": CLUSTER_NAME,
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def load_scheduler_config(source: Path = SCHEDULER_CONFIG) -> dict[str, Any]:
    try:
        config = yaml.safe_load(source.read_text())
    except OSError as error:
        raise ClusterError(f"{source}: cannot read: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ClusterError(f"{source}: not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(config, dict) or config.get("apiVersion") != SCHEDULER_API_VERSION:
        raise ClusterError(f"{source}: expected a {SCHEDULER_API_VERSION} configuration")
    return config


def render_scheduler_config(
    kubeconfig: Path,
    *,
    extender: bool,
    extender_url: str | None = None,
    source: Path = SCHEDULER_CONFIG,
) -> str:
    """The project's scheduler configuration for a local cluster, as YAML text."""
    config = load_scheduler_config(source)
    connection = config.get("clientConnection") or {}
    config["clientConnection"] = {**connection, "kubeconfig": str(kubeconfig)}
    # One scheduler, and a fresh etcd each time: electing a leader would only add seconds.
    config["leaderElection"] = {"leaderElect": False}
    if not extender:
        config.pop("extenders", None)
    elif extender_url is not None:
        for entry in config.get("extenders", []):
            if entry.get("urlPrefix", "").endswith(protocol.EXTENDER_PATH_PREFIX):
                entry["urlPrefix"] = extender_url.rstrip("/")
    return yaml.safe_dump(config, sort_keys=False)
