"""The files Allocate mounts into containers, on the host, and their removal.

Under the host state root (``--host-state-dir``, default /var/lib/gpushare):
``ld.so.preload`` (one line: where the container sees the interception library) and, per
served container, ``containers/<pod uid>/<container>/limits.conf`` (read-only in the
container) and ``.../state/`` (the container's /var/run/gpushare, where the library keeps its
shared state file). A pod's directory goes once the pod is gone from the node.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Collection
from pathlib import Path

from gpushare import protocol

log = logging.getLogger("gpushare.deviceplugin")

GC_GRACE_S = 300.0  # a directory this young is kept even if its pod is not (yet) listed


def _write_atomic(path: Path, text: str, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.chmod(mode)
    os.replace(temporary, path)


class ContainerFiles:
    """The host side of the per-container mounts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.containers = root / "containers"

    def preload(self) -> Path:
        """The ld.so.preload file naming the library's path in the container (written once)."""
        path = self.root / "ld.so.preload"
        text = protocol.CONTAINER_LIBRARY_PATH + "\n"
        if not path.is_file() or path.read_text() != text:
            self.root.mkdir(parents=True, exist_ok=True)
            _write_atomic(path, text, 0o444)
        return path

    def prepare(self, uid: str, container: str, limits: str) -> tuple[Path, Path]:
        """The container's limits file (written) and state directory (made, world-writable)."""
        directory = self.containers / uid / container
        state = directory / "state"
        state.mkdir(parents=True, exist_ok=True)
        state.chmod(0o1777)  # any user of the container may create the state file in it
        limits_path = directory / "limits.conf"
        _write_atomic(limits_path, limits, 0o444)
        return limits_path, state

    def mark_owner(self, uid: str, container: str, owner_uid: str, owner_container: str) -> None:
        """Record that the files made for ``uid``/``container`` serve another container.

        After a swap (swaps.py) a container keeps the mounts it was served, which were made
        for the other pod's decision; the monitor reads this to attribute the state file.
        """
        directory = self.containers / uid / container
        if directory.is_dir():
            text = f"{owner_uid}/{owner_container}\n"
            _write_atomic(directory / protocol.HOST_OWNER_FILE, text, 0o444)

    def collect(self, live_uids: Collection[str], grace_s: float = GC_GRACE_S) -> list[str]:
        """Removes the directories of pods not in ``live_uids``; returns the removed uids."""
        if not self.containers.is_dir():
            return []
        removed = []
        now = time.time()
        for entry in self.containers.iterdir():
            if entry.name in live_uids or not entry.is_dir():
                continue
            try:
                if now - entry.stat().st_mtime < grace_s:
                    continue
                shutil.rmtree(entry)
            except OSError as error:
                log.warning("cannot remove %s: %s", entry, error)
                continue
            removed.append(entry.name)
        return removed
