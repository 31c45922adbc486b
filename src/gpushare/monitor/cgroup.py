"""Which Kubernetes container a process belongs to, from ``/proc/<pid>/cgroup``.

kubelet puts each pod in a cgroup named after its UID and each container in a child named
after its runtime ID. The names differ by cgroup driver and runtime:

- cgroupfs driver: ``/kubepods[/burstable|/besteffort]/pod<uid>/<id>`` (containerd, docker)
  or ``.../pod<uid>/crio-<id>`` (CRI-O);
- systemd driver: ``/kubepods.slice[/kubepods-burstable.slice]/kubepods[-burstable]-pod<uid
  with _ for ->.slice/<runtime>-<id>.scope``, runtime ``cri-containerd``, ``crio`` or
  ``docker``.

cgroup v1 lists one line per hierarchy (``ID:controllers:path``), v2 one line (``0::path``);
the path may have a prefix (a node inside a container, a cgroup namespace) and a suffix
(a container that makes sub-cgroups), so the pod component is searched anywhere and the
container is the component right after it. CRI-O's ``crio-conmon-<id>`` (its monitor process)
is not a container.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"^(?:pod({_UID})|kubepods(?:-[a-z]+)?-pod({_UID})\.slice)$")
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pod_uid: str  # with dashes, as metadata.uid
    container_id: str  # the runtime's ID, without the containerd:// style scheme


def parse(text: str) -> ContainerRef | None:
    """The container a ``/proc/<pid>/cgroup`` text names; None for any other process."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        for i, part in enumerate(parts[:-1]):
            pod = _POD.match(part)
            if pod is None:
                continue
            container = _CONTAINER.match(parts[i + 1])
            if container is None:
                break
            uid = (pod.group(1) or pod.group(2)).replace("_", "-")
            return ContainerRef(uid, container.group(1))
    return None


def container_of(proc_root: Path, pid: int) -> ContainerRef | None:
    """The container of process ``pid`` under ``proc_root`` (``/proc`` on a node, a fixture
    tree in tests); None if it is gone, unreadable or not in a container."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return parse(text)


def runtime_id(container_id: str) -> str:
    """``containerd://abc`` (a pod's status.containerStatuses[].containerID) → ``abc``."""
    return container_id.rpartition("://")[2]
