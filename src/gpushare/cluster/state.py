"""The state directory of a local cluster: where each file lives, and what runs.

Everything a cluster writes lives under one directory: certificates, kubeconfigs, etcd's
data, logs, pid files and ``state.json`` (what runs where). A marker file says the
directory is ours, so that `down` never deletes a directory it did not create.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

MARKER = ".gpushare-cluster"
STATE_VERSION = 1


class ClusterError(RuntimeError):
    """A cluster operation that cannot go on; the message is one line for the user."""


def default_state_dir() -> Path:
    """``${XDG_STATE_HOME:-~/.local/state}/gpushare/cluster``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpushare" / "cluster"


@dataclass(slots=True)
class ProcessRecord:
    """One process of the cluster: its pid, the port it serves on and its log."""

    name: str
    pid: int
    log: str
    port: int | None = None
    url: str | None = None


@dataclass(slots=True)
class ClusterState:
    """What `up` started, as written to ``state.json``."""

    state_dir: str
    kubeconfig: str
    bin_dir: str
    apiserver_url: str
    node_count: int
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    extender: bool = False
    version: int = STATE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        data = json.loads(text)
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"state version {data.get('version')!r}, expected {STATE_VERSION}")
        data["processes"] = {
            name: ProcessRecord(**record) for name, record in data["processes"].items()
        }
        return cls(**data)


class StateDir:
    """The paths of one cluster's state directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def nodes_file(self) -> Path:
        return self.root / "nodes.json"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        return self.root / "scheduler.kubeconfig"

    @property
    def scheduler_config(self) -> Path:
        return self.root / "kube-scheduler-config.yaml"

    def is_ours(self) -> bool:
        return self.marker.is_file()

    def exists(self) -> bool:
        return self.root.exists()

    def create(self) -> None:
        """Create a fresh, empty state directory (mode 0700: it holds private keys)."""
        if self.root.exists() and any(self.root.iterdir()) and not self.is_ours():
            raise ClusterError(
                f"state dir {self.root} is not empty and was not made by gpushare cluster; "
                "choose another --state-dir"
            )
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)
        self.marker.write_text("made by `gpushare cluster up`; `gpushare cluster down` removes\n")
        for folder in (self.pki, self.logs, self.run):
            folder.mkdir(mode=0o700, exist_ok=True)

    def remove(self) -> None:
        """Delete the state directory, but only one that `up` made."""
        if not self.root.exists():
            return
        if not self.is_ours():
            raise ClusterError(
                f"state dir {self.root} was not made by gpushare cluster; not removing it"
            )
        shutil.rmtree(self.root)

    def read_state(self) -> ClusterState | None:
        """The recorded state, or None if there is none or it cannot be read."""
        try:
            return ClusterState.from_json(self.state_file.read_text())
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def write_state(self, state: ClusterState) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(state.to_json())
        tmp.replace(self.state_file)

    def read_nodes(self) -> list[str]:
        return json.loads(self.nodes_file.read_text())

    def write_nodes(self, names: list[str]) -> None:
        self.nodes_file.write_text(json.dumps(names) + "\n")


@contextlib.contextmanager
def locked(state_dir: StateDir) -> Iterator[None]:
    """Hold an exclusive lock so that two `up`/`down` on one state dir take turns.

    The lock is on the parent directory, which outlives the state dir that `down` removes.
    """
    parent = state_dir.root.parent
    parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
