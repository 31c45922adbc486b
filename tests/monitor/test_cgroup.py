"""Processes to containers through /proc/<pid>/cgroup, for each cgroup driver and runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpushare.monitor.cgroup import ContainerRef, container_of, parse, runtime_id

UID = "8f4b2c1e-5d6a-4b7c-9e8f-0a1b2c3d4e5f"
UNDER = UID.replace("-", "_")
CID = "0123456789abcdef" * 4
OUTER = "f" * 64  # the kind node's own container


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v1, cgroupfs driver, containerd or docker (burstable, best effort, guaranteed)
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n",
        f"4:devices:/kubepods/besteffort/pod{UID}/{CID}\n",
        f"4:devices:/kubepods/pod{UID}/{CID}\n",
        # cgroup v1, systemd driver
        f"5:cpuset:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDER}.slice/cri-containerd-{CID}.scope\n",
        f"5:cpuset:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDER}.slice/docker-{CID}.scope\n",
        # cgroup v2, systemd driver: containerd, CRI-O, docker; guaranteed QoS
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDER}.slice/cri-containerd-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDER}.slice/crio-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-pod{UNDER}.slice/docker-{CID}.scope\n",
        # cgroup v2, cgroupfs driver: containerd, CRI-O
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        f"0::/kubepods/besteffort/pod{UID}/crio-{CID}\n",
        # a node inside a container (kind): a prefix; a container with sub-cgroups: a suffix
        f"0::/docker/{OUTER}/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubepods-burstable-pod{UNDER}.slice/cri-containerd-{CID}.scope/init\n",
        # hybrid v1 with an empty unified line first
        f"0::/\n3:memory:/kubepods/pod{UID}/{CID}\n",
    ],
    ids=[
        "v1-cgroupfs",
        "v1-cgroupfs-besteffort",
        "v1-cgroupfs-guaranteed",
        "v1-systemd-containerd",
        "v1-systemd-docker",
        "v2-systemd-containerd",
        "v2-systemd-crio",
        "v2-systemd-guaranteed-docker",
        "v2-cgroupfs-containerd",
        "v2-cgroupfs-crio",
        "nested-kind",
        "hybrid",
    ],
)
def test_container_processes_are_recognised(text: str) -> None:
    assert parse(text) == ContainerRef(UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/containerd.service\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDER}.slice\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDER}.slice/crio-conmon-{CID}.scope\n",
        f"0::/kubepods/burstable/pod{UID}/not-a-container\n",
        f"0::/kubepods/burstable/podnot-a-uid/{CID}\n",
        "",
        "garbage without colons\n",
    ],
    ids=["runtime", "session", "pod-only", "conmon", "bad-id", "bad-uid", "empty", "garbage"],
)
def test_other_processes_belong_to_no_container(text: str) -> None:
    assert parse(text) is None


def test_container_of_reads_the_proc_root(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    (tmp_path / "78").mkdir()
    (tmp_path / "78" / "cgroup").write_bytes(b"\xff\xfe")
    assert container_of(tmp_path, 77) == ContainerRef(UID, CID)
    assert container_of(tmp_path, 78) is None  # unreadable
    assert container_of(tmp_path, 79) is None  # gone


def test_runtime_id_drops_the_scheme() -> None:
    assert runtime_id(f"containerd://{CID}") == CID
    assert runtime_id(f"cri-o://{CID}") == CID
    assert runtime_id(CID) == CID
