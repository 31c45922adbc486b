"""A local Kubernetes control plane with simulated GPU nodes, for tests and demos.

`gpushare cluster up` runs etcd, kube-apiserver and kube-scheduler on loopback ports in a
state directory and registers simulated GPU nodes; no kubelet runs, so pods get bound to a
node and are never started. See docs/cluster.md.
"""

from gpushare.cluster.control_plane import ClusterInfo, NodeSpec, down, status, up
from gpushare.cluster.state import ClusterError, default_state_dir

__all__ = [
    "ClusterError",
    "ClusterInfo",
    "NodeSpec",
    "default_state_dir",
    "down",
    "status",
    "up",
]
