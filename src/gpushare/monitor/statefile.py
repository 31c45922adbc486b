"""Reads the interception library's shared state file (docs/isolation.md, "Shared state file").

The layout is native/src/state.h, version 1: a 64-byte header, 16 device records of 64 bytes,
256 process slots of 144 bytes, all little-endian 64-bit fields. The reader checks the magic,
the version and every size in the header against the file, so a foreign, truncated or newer
file is refused with one line naming it instead of being read at the wrong offsets.

The file is live (processes update it with atomics while we read); a read is a snapshot of
each field, not of the whole file, which is what a monitor needs.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpushare import protocol

MAGIC = 0x3145544154534753  # "GSSTATE1" read as a little-endian integer
VERSION = 1
HEADER_BYTES = 64
DEVICE_COUNT = 16
DEVICE_BYTES = 64
SLOT_COUNT = 256
SLOT_BYTES = 144
FILE_BYTES = HEADER_BYTES + DEVICE_COUNT * DEVICE_BYTES + SLOT_COUNT * SLOT_BYTES  # 37,952
FILE_NAME = "gpushare.state"

# Header: magic, version, header size, device count, slot count, slot size, device size, file
# size, creation time (ns), refused allocations (formerly reserved), reserved.
_HEADER = struct.Struct("<QIIIIIIQQQQ")
# Device record: limit, used, then six limiter fields the monitor does not read.
_DEVICE = struct.Struct("<QQ")
# Slot: tag, start time, used per device.
_SLOT = struct.Struct(f"<QQ{DEVICE_COUNT}Q")
_WORDS = struct.Struct(f"<{FILE_BYTES // 8}Q")
SLOT_CLAIMING = 1 << 62
SLOT_RECLAIMING = 1 << 63
SLOT_PID_MASK = 0xFFFFFFFF

assert _HEADER.size == HEADER_BYTES and _SLOT.size == SLOT_BYTES


class StateFileError(ValueError):
    """A state file that cannot be read as version 1; the message names the file."""


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One device index of the container (its CUDA order, not the node's)."""

    limit_bytes: int  # the creator's limit (informational; 0: none)
    used_bytes: int  # charged by all the container's processes


@dataclass(frozen=True, slots=True)
class ProcessSlot:
    """A published process slot: pid in the container's pid namespace, bytes per device."""

    pid: int
    start_time_ticks: int
    used_bytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ContainerState:
    path: Path
    created_unix_ns: int
    refused_allocations: int
    devices: tuple[DeviceUsage, ...]
    processes: tuple[ProcessSlot, ...]


def parse(data: bytes, path: Path) -> ContainerState:
    """A state file's content; StateFileError (one line) if it is not a version-1 file."""
    where = f"state file {path}"
    if len(data) < HEADER_BYTES:
        raise StateFileError(f"{where}: truncated ({len(data)} bytes, header is {HEADER_BYTES})")
    (magic, version, header, devices, slots, slot_size, device_size, size, created, refused, _) = (
        _HEADER.unpack_from(data)
    )
    if magic == 0:
        raise StateFileError(f"{where}: not initialised yet (magic is 0)")
    if magic != MAGIC:
        raise StateFileError(f"{where}: wrong magic {magic:#018x} (expected {MAGIC:#018x})")
    if version != VERSION:
        raise StateFileError(f"{where}: unsupported version {version} (this reader: {VERSION})")
    expected = (HEADER_BYTES, DEVICE_COUNT, SLOT_COUNT, SLOT_BYTES, DEVICE_BYTES, FILE_BYTES)
    found = (header, devices, slots, slot_size, device_size, size)
    if found != expected:
        raise StateFileError(
            f"{where}: wrong layout (header, devices, slots, slot size, device size, file size "
            f"= {found}, expected {expected})"
        )
    if len(data) != FILE_BYTES:
        raise StateFileError(f"{where}: wrong size {len(data)} bytes (expected {FILE_BYTES})")
    words = _WORDS.unpack(data)
    device_base = HEADER_BYTES // 8
    usage = tuple(
        DeviceUsage(words[device_base + i * 8], words[device_base + i * 8 + 1])
        for i in range(DEVICE_COUNT)
    )
    processes = []
    slot_base = (HEADER_BYTES + DEVICE_COUNT * DEVICE_BYTES) // 8
    step = SLOT_BYTES // 8
    for i in range(SLOT_COUNT):
        start = slot_base + i * step
        tag = words[start]
        if tag == 0 or tag & (SLOT_CLAIMING | SLOT_RECLAIMING):
            continue
        processes.append(
            ProcessSlot(
                tag & SLOT_PID_MASK, words[start + 1], words[start + 2 : start + 2 + DEVICE_COUNT]
            )
        )
    return ContainerState(path, created, refused, usage, tuple(processes))


def read(path: Path) -> ContainerState | None:
    """The state file at ``path``; None if there is none; StateFileError if it is unusable.

    The directory is writable by the container, so the file is opened without following a
    symlink and without blocking (a FIFO would otherwise hang the scrape), and must be a
    regular file; at most one byte more than a version-1 file is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise StateFileError(f"state file {path}: cannot open: {error.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateFileError(f"state file {path}: not a regular file")
        data = os.read(fd, FILE_BYTES + 1)
    except OSError as error:
        raise StateFileError(f"state file {path}: cannot read: {error.strerror}") from None
    finally:
        os.close(fd)
    return parse(data, path)


def container_dir(root: Path, pod_uid: str, container: str) -> Path:
    """A container's state directory on the node: ``ROOT/containers/<pod uid>/<container>/state``.

    The device plugin makes it and mounts it into the container as the library's state_dir
    (``protocol.CONTAINER_STATE_DIR``); ROOT is its host state root (``protocol.HOST_STATE_ROOT``
    by default), the monitor's ``--state-root``.
    """
    return root / "containers" / pod_uid / container / "state"


def owners(root: Path) -> dict[tuple[str, str], Path]:
    """State directories that serve another container than their path names, by that
    container's (pod uid, name): after the device plugin saw kubelet admit two identical
    containers the other way round (its ``protocol.HOST_OWNER_FILE`` markers). Usually empty."""
    found: dict[tuple[str, str], Path] = {}
    for marker in root.glob(f"containers/*/*/{protocol.HOST_OWNER_FILE}"):
        try:
            uid, _, name = marker.read_text().strip().partition("/")
        except OSError:
            continue
        if uid and name:
            found[(uid, name)] = marker.parent / "state"
    return found


def state_dir_of(
    root: Path, pod_uid: str, container: str, moved: dict[tuple[str, str], Path]
) -> Path | None:
    """Where the container's state file is: its own directory, or the one it was served
    instead (``owners``); None when its own directory serves another container."""
    if (pod_uid, container) in moved:
        return moved[(pod_uid, container)]
    own = container_dir(root, pod_uid, container)
    if (own.parent / protocol.HOST_OWNER_FILE).exists():
        return None
    return own


def encode(
    devices: Sequence[tuple[int, int]],
    processes: Sequence[tuple[int, int, Sequence[int]]] = (),
    *,
    refused: int = 0,
    created_unix_ns: int = 0,
) -> bytes:
    """A version-1 file with these (limit, used) devices and (pid, start, used) slots.

    For tests and benchmarks that need many files; the tests cross-check it, and the reader,
    against files the C library wrote.
    """
    header = _HEADER.pack(
        MAGIC,
        VERSION,
        HEADER_BYTES,
        DEVICE_COUNT,
        SLOT_COUNT,
        SLOT_BYTES,
        DEVICE_BYTES,
        FILE_BYTES,
        created_unix_ns,
        refused,
        0,
    )
    body = bytearray(FILE_BYTES)
    body[:HEADER_BYTES] = header
    for i, (limit, used) in enumerate(devices):
        _DEVICE.pack_into(body, HEADER_BYTES + i * DEVICE_BYTES, limit, used)
    base = HEADER_BYTES + DEVICE_COUNT * DEVICE_BYTES
    for i, (pid, start, used) in enumerate(processes):
        padded = [*used, *[0] * (DEVICE_COUNT - len(used))]
        _SLOT.pack_into(body, base + i * SLOT_BYTES, pid, start, *padded)
    return bytes(body)
