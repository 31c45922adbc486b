"""The state-file reader against files the interception library wrote, and against bad ones."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from monitor_helpers import MIB, mock_env, write_config

from gpushare.monitor import statefile

OVERHEAD = 64 * MIB


def _limits(tmp_path: Path, state_dir: Path, limit: int) -> Path:
    path = tmp_path / "limits.conf"
    path.write_text(
        f"memory_limit_bytes={limit}\ncontext_overhead_bytes={OVERHEAD}\nstate_dir={state_dir}\n"
    )
    return path


def _env(native_build: Path, tmp_path: Path, limits: Path) -> dict[str, str]:
    env = mock_env(write_config(tmp_path / "mock.json"))
    env["LD_PRELOAD"] = str(native_build / "testing" / "libgpushare.so")
    env["GPUSHARE_TEST_LIMITS_PATH"] = str(limits)
    return env


def test_reader_agrees_with_a_file_the_library_wrote(native_build: Path, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    limit = OVERHEAD + 10 * 64 * MIB + 32 * MIB
    env = _env(native_build, tmp_path, _limits(tmp_path, state_dir, limit))
    worker = subprocess.Popen(
        [str(native_build / "tests" / "intercept_worker"), str(64 * MIB)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None and worker.stdin is not None
        assert worker.stdout.readline().strip() == "ready"
        worker.stdin.write("go\n")
        worker.stdin.flush()
        count = int(worker.stdout.readline().split("=")[1])
        used = int(worker.stdout.readline().split("=")[1])
        state = statefile.read(state_dir / statefile.FILE_NAME)
        assert state is not None
        assert count == 10 and used == OVERHEAD + 10 * 64 * MIB
        assert state.devices[0] == statefile.DeviceUsage(limit, used)
        assert state.refused_allocations == 1  # the 11th block
        assert [(p.pid, p.used_bytes[0]) for p in state.processes] == [(worker.pid, used)]
        assert state.created_unix_ns > 0
        # The library's header and our encoder's agree field for field (bytes 8..40:
        # version, sizes, counts).
        written = (state_dir / statefile.FILE_NAME).read_bytes()
        assert written[8:40] == statefile.encode([])[8:40]
        assert len(written) == statefile.FILE_BYTES
        worker.stdin.write("exit\n")
        worker.stdin.flush()
        assert worker.wait(timeout=20) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.communicate()
    after = statefile.read(state_dir / statefile.FILE_NAME)
    assert after is not None
    assert after.devices[0].used_bytes == 0 and after.processes == ()
    assert after.refused_allocations == 1  # a counter: it outlives the process


def test_refusals_are_counted_across_processes(native_build: Path, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    env = _env(native_build, tmp_path, _limits(tmp_path, state_dir, 1 << 30))
    for _ in range(2):
        result = subprocess.run(
            [str(native_build / "tests" / "intercept_alloc"), "alloc", str(600 * MIB)],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "refused" in result.stderr
    state = statefile.read(state_dir / statefile.FILE_NAME)
    assert state is not None and state.refused_allocations == 2


def test_encode_then_parse_round_trips(tmp_path: Path) -> None:
    data = statefile.encode(
        [(10 * MIB, 3 * MIB), (0, 0), (5, 4)],
        [(42, 7, [MIB, 0, 4]), (43, 8, [2 * MIB])],
        refused=5,
        created_unix_ns=99,
    )
    state = statefile.parse(data, tmp_path / "x")
    assert state.devices[:3] == (
        statefile.DeviceUsage(10 * MIB, 3 * MIB),
        statefile.DeviceUsage(0, 0),
        statefile.DeviceUsage(5, 4),
    )
    assert [(p.pid, p.start_time_ticks, p.used_bytes[:3]) for p in state.processes] == [
        (42, 7, (MIB, 0, 4)),
        (43, 8, (2 * MIB, 0, 0)),
    ]
    assert (state.refused_allocations, state.created_unix_ns) == (5, 99)


def test_claiming_and_reclaiming_slots_are_not_processes(tmp_path: Path) -> None:
    data = statefile.encode(
        [], [(42 | statefile.SLOT_CLAIMING, 1, [1]), (43 | statefile.SLOT_RECLAIMING, 1, [1])]
    )
    assert statefile.parse(data, tmp_path / "x").processes == ()


GOOD = statefile.encode([])


def _with(offset: int, value: bytes) -> bytes:
    return GOOD[:offset] + value + GOOD[offset + len(value) :]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x7fELF" + GOOD[4:], "wrong magic"),
        (GOOD[:40], "truncated"),
        (_with(0, bytes(8)), "not initialised yet"),
        (_with(8, (7).to_bytes(4, "little")), "unsupported version 7"),
        (_with(20, (128).to_bytes(4, "little")), "wrong layout"),
        (GOOD[:-100], "wrong size"),
        (GOOD + b"\0", "wrong size"),
    ],
    ids=["foreign", "truncated", "uninitialised", "version", "slots", "short", "long"],
)
def test_bad_files_are_refused_with_their_name(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "gpushare.state"
    path.write_bytes(content)
    with pytest.raises(statefile.StateFileError) as caught:
        statefile.read(path)
    message = str(caught.value)
    assert message.startswith(f"state file {path}: ") and problem in message
    assert "\n" not in message


def test_missing_file_is_none_and_unreadable_one_an_error(tmp_path: Path) -> None:
    assert statefile.read(tmp_path / "absent") is None
    with pytest.raises(statefile.StateFileError, match="not a regular file"):
        statefile.read(tmp_path)  # a directory


def test_a_tenant_cannot_hang_or_redirect_the_reader(tmp_path: Path) -> None:
    # The state directory is writable by the container: a FIFO must not block the scrape,
    # a symlink must not make the monitor read a file of the host.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(statefile.StateFileError, match="not a regular file"):
        statefile.read(fifo)
    target = tmp_path / "host-file"
    target.write_bytes(GOOD)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(statefile.StateFileError, match="cannot open"):
        statefile.read(link)
