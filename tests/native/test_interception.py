"""The interception library (native/build/libgpushare.so) against the mock driver.

Each test runs a native/tests/intercept_*.c program with the library preloaded (the testing
build, so GPUSHARE_TEST_LIMITS_PATH can point the limits file into tmp_path), the mock driver on
LD_LIBRARY_PATH and a private state directory.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[2] / "native"
MIB = 1 << 20
GIB = 1 << 30
OVERHEAD = 64 * MIB  # context_overhead_bytes used by these tests
PROGRAMS = [
    "intercept_alloc",
    "intercept_dlsym",
    "intercept_fork",
    "intercept_graph",
    "intercept_info",
    "intercept_launch",
    "intercept_legacy",
    "intercept_pooldev",
    "intercept_procaddress",
    "intercept_procs",
    "intercept_refused",
    "intercept_stress",
    "intercept_worker",
]
DEVICES = [
    {
        "name": "NVIDIA H200",
        "uuid": "GPU-12345678-1234-1234-1234-123456789abc",
        "memory_mib": 143771,
        "sm_count": 132,
    }
]
OOM_LINE = re.compile(
    r"^gpushare: GPU (\d+): allocation of [\d.]+ (?:B|KiB|MiB|GiB|TiB) refused: "
    r"[\d.]+ (?:B|KiB|MiB|GiB|TiB) of [\d.]+ (?:B|KiB|MiB|GiB|TiB) limit in use$",
    re.M,
)
SAN = {
    "asan": "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all",
    "tsan": "-fsanitize=thread",
}


def _make(build: str, san: str = "") -> Path:
    targets = [f"{build}/libgpushare.so", f"{build}/testing/libgpushare.so"]
    targets += [f"{build}/tests/{name}" for name in PROGRAMS]
    args = ["make", "-C", str(NATIVE), "--no-print-directory", "-j8", f"BUILD={build}"]
    if san:
        args.append(f"SAN_FLAGS={san}")
    result = subprocess.run(args + targets, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"native build failed:\n{result.stdout}\n{result.stderr}")
    return NATIVE / build


@pytest.fixture(scope="session")
def lib_build() -> Path:
    return _make("build")


def mock_env(build: Path, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env["GPUSHARE_MOCK_CONFIG"] = str(config)
    env["LD_LIBRARY_PATH"] = str(build / "mock")
    return env


def _runtime(name: str) -> str:
    cc = os.environ.get("CC", "cc")
    out = subprocess.run(
        [cc, f"-print-file-name=lib{name}.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return out


def values(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


class Env:
    """One container: a mock GPU, a limits file (or none), a state directory."""

    def __init__(self, build: Path, tmp: Path, config: Path, preload: str = "") -> None:
        self.build = build
        self.tmp = tmp
        self.config = config
        self.state_dir = tmp / "state"
        self.limits_path = tmp / "limits.conf"
        self.preload = preload

    def limits(self, text: str | None = None, **keys: object) -> None:
        body = text if text is not None else "".join(f"{k}={v}\n" for k, v in keys.items())
        self.limits_path.write_text(body)

    def default_limits(self, limit: int, **extra: object) -> None:
        self.limits(
            memory_limit_bytes=limit,
            context_overhead_bytes=OVERHEAD,
            state_dir=self.state_dir,
            **extra,
        )

    def env(self, **extra: str) -> dict[str, str]:
        env = mock_env(self.build, self.config)
        lib = self.build / "testing" / "libgpushare.so"
        env["LD_PRELOAD"] = f"{self.preload}:{lib}" if self.preload else str(lib)
        env["GPUSHARE_TEST_LIMITS_PATH"] = str(self.limits_path)
        env["GPUSHARE_STATE_DIR"] = str(self.state_dir)
        env.update(extra)
        return env

    def run(self, program: str, *args: object, timeout: float = 30, **extra: str):
        return subprocess.run(
            [str(self.build / "tests" / program), *map(str, args)],
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def popen(self, program: str, *args: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.build / "tests" / program), *map(str, args)],
            env=self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture
def container(lib_build: Path, tmp_path: Path, mock_config: Callable[..., Path]) -> Env:
    return Env(lib_build, tmp_path, mock_config(devices=DEVICES))


def ok(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    return values(result.stdout)


# ---- each allocation API against the limit -------------------------------------------------

CHUNK = 512 * MIB
CHARGE = {"mipmap": 8192 * 8192 * 4 + 4096 * 4096 * 4}  # 2 levels of 8192^2 float


@pytest.mark.parametrize(
    "api", ["alloc", "pitch", "managed", "async", "pool", "create", "array", "array3d", "mipmap"]
)
def test_each_api_is_limited(container: Env, api: str) -> None:
    charge = CHARGE.get(api, CHUNK)
    limit = OVERHEAD + charge * 3 // 2
    container.default_limits(limit)
    result = container.run("intercept_alloc", api, CHUNK)
    v = ok(result)
    assert int(v["total"]) == limit
    assert int(v["used0"]) == OVERHEAD  # the context charge
    assert v["rc1"] == "0" and int(v["used1"]) == OVERHEAD + charge
    assert v["rc2"] == "2"  # CUDA_ERROR_OUT_OF_MEMORY
    assert v["rc3"] == "0"  # the free gave back exactly what was charged
    assert int(v["used_end"]) == OVERHEAD
    lines = OOM_LINE.findall(result.stderr)
    assert lines == ["0"], result.stderr
    if api in ("async", "pool"):
        # The pool keeps its reservation after cuMemFreeAsync until it is trimmed.
        assert int(v["used_pool_kept"]) == OVERHEAD + charge


@pytest.mark.parametrize("mode", ["default", "current", "created", "stream"])
def test_pool_allocation_charges_the_pools_device(
    lib_build: Path, tmp_path: Path, mock_config: Callable[..., Path], mode: str
) -> None:
    # Context on device 0 (no limit there); the allocation lands on device 1 (1 GiB limit):
    # from its default / current pool, a pool created there, or a stream of a device-1 context.
    devices = [*DEVICES, dict(DEVICES[0], uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")]
    env = Env(lib_build, tmp_path, mock_config(devices=devices))
    env.limits(f"memory_limit_bytes.1=1GiB\nstate_dir={env.state_dir}\n")
    assert ok(env.run("intercept_pooldev", mode, 512 * MIB))["rc"] == "0"
    result = env.run("intercept_pooldev", mode, 2 * GIB)
    v = ok(result)
    assert v["rc"] == "2"  # refused against device 1's limit
    assert OOM_LINE.findall(result.stderr) == ["1"], result.stderr
    if mode == "stream":
        assert v["current_kept"] == "1"  # the caller's context is current again


# ---- legacy (pre-_v2) entry points and the newer context versions --------------------------

V1_MAX = (1 << 32) - 1


def test_legacy_entry_points_are_limited(container: Env) -> None:
    limit = GIB
    container.default_limits(limit)
    result = container.run("intercept_legacy", "alloc", 2 * GIB)
    v = ok(result)
    assert int(v["used_ctx"]) == OVERHEAD and int(v["used_ctx_v1"]) == OVERHEAD  # cuCtxCreate
    assert int(v["used_alloc"]) == OVERHEAD + 100 * MIB  # cuMemAlloc
    assert v["pitch"] == "1024"
    assert int(v["used_pitch"]) == OVERHEAD + 100 * MIB + 1024 * 2048  # pitch x height
    assert v["refused_rc"] == "2" and v["refused_pitch_rc"] == "2"
    assert int(v["used_freed"]) == OVERHEAD  # cuMemFree gave back what was charged
    assert int(v["used_array"]) == OVERHEAD + 16 * MIB  # 1024^2 x float4
    assert int(v["used_array3d"]) == OVERHEAD + 17 * MIB  # + 256 x 256 x 16 bytes
    assert v["refused_array_rc"] == "2"
    assert int(v["used_arrays_freed"]) == OVERHEAD
    # The 32-bit queries show the slice (it fits: exact).
    assert int(v["v1_total"]) == limit and int(v["v1_device_total"]) == limit
    assert int(v["v1_free"]) == limit - OVERHEAD
    # cuCtxDestroy released the legacy context; _v3 and _v4 contexts are charged the overhead.
    assert int(v["used_v3"]) == OVERHEAD
    assert int(v["used_v4"]) == 2 * OVERHEAD
    assert int(v["used_v4_destroyed"]) == OVERHEAD
    # The pre-11.0 cuDevicePrimaryCtxRelease released the primary context's charge.
    assert int(v["used_primary"]) == OVERHEAD and int(v["used_primary_released"]) == OVERHEAD
    assert OOM_LINE.findall(result.stderr) == ["0", "0", "0"], result.stderr


@pytest.mark.parametrize(
    ("limit", "total", "free"),
    [
        (10 * GIB, V1_MAX, V1_MAX),  # a slice over 4 GiB reads UINT_MAX, as from the driver
        (3 * GIB, 3 * GIB, 3 * GIB - OVERHEAD),
        (None, V1_MAX, V1_MAX),  # no limit: the driver's own (clamped) answer
    ],
)
def test_legacy_queries_clamp_to_32_bits(
    container: Env, limit: int | None, total: int, free: int
) -> None:
    if limit is None:
        container.limits(f"state_dir={container.state_dir}\n")
    else:
        container.default_limits(limit)
    v = ok(container.run("intercept_legacy", "info"))
    assert int(v["v1_total"]) == total and int(v["v1_device_total"]) == total
    assert int(v["v1_free"]) == free


def test_every_context_version_is_charged(container: Env) -> None:
    container.default_limits(OVERHEAD + OVERHEAD // 2)  # room for one context
    result = container.run("intercept_legacy", "contexts")
    v = ok(result)
    assert v["v4_rc"] == "2" and v["v2_rc"] == "2" and v["v1_rc"] == "2"
    assert v["v4_after_rc"] == "0"
    assert OOM_LINE.findall(result.stderr) == ["0", "0", "0"], result.stderr


def test_get_proc_address_old_versions(container: Env) -> None:
    container.default_limits(GIB)
    v = ok(container.run("intercept_legacy", "procaddress", 2 * GIB))
    hooks = [k for k in v if "@" in k]
    assert len(hooks) == 12
    assert all(v[k] == "1" for k in hooks), v  # each resolved to our hook
    assert v["alloc_rc"] == "2"  # the legacy cuMemAlloc handed out is limited
    assert int(v["info_total"]) == GIB


def test_refusal_line_names_device_limit_and_usage(container: Env) -> None:
    container.default_limits(GIB)
    result = container.run("intercept_alloc", "alloc", 600 * MIB)
    ok(result)
    assert (
        "gpushare: GPU 0: allocation of 600.0 MiB refused: 664.0 MiB of 1.0 GiB limit in use\n"
        in result.stderr
    )


def test_oom_policy_exit(container: Env) -> None:
    container.default_limits(GIB, oom_policy="exit")
    result = container.run("intercept_alloc", "alloc", 600 * MIB)
    assert result.returncode == 12, result.stderr
    assert values(result.stdout)["rc1"] == "0"
    assert "rc2" not in values(result.stdout)
    assert len(OOM_LINE.findall(result.stderr)) == 1


# ---- what programs see ----------------------------------------------------------------------


def test_reports_the_slice(container: Env) -> None:
    limit = 10 * GIB
    container.default_limits(limit)
    v = ok(container.run("intercept_info", 100 * MIB))
    used = OVERHEAD + 100 * MIB
    assert v["alloc_rc"] == "0"
    assert int(v["cu_total"]) == limit and int(v["cu_free"]) == limit - used
    assert int(v["cu_device_total"]) == limit
    assert int(v["nvml_total"]) == limit
    assert int(v["nvml_used"]) == used and int(v["nvml_free"]) == limit - used
    assert int(v["nvml2_total"]) == limit
    assert int(v["nvml2_used"]) == used and int(v["nvml2_free"]) == limit - used


def _procs(text: str) -> dict[int, int]:
    return {int(p): int(u) for p, _, u in (e.partition(":") for e in text.split(",") if e)}


def _stop(workers: list[subprocess.Popen[str]]) -> None:
    for w in workers:
        w.communicate("", timeout=30)  # stdin closed before "go": exits at once
        assert w.returncode == 0


def test_process_list_shows_only_the_container(
    lib_build: Path, tmp_path: Path, mock_config: Callable[..., Path]
) -> None:
    # Two containers (two state directories, two limits files) on one mock GPU.
    config = mock_config(devices=DEVICES)
    containers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        containers.append(Env(lib_build, tmp_path / name, config))
        containers[-1].default_limits(4 * GIB)
    holders = [_start_workers(c, 1, 64 * MIB)[0] for c in containers]
    try:
        for c, holder, b in zip(containers, holders, (100 * MIB, 200 * MIB), strict=True):
            v = ok(c.run("intercept_procs", b))
            me = int(v["self"])
            expected = {holder.pid: OVERHEAD, me: OVERHEAD + b}  # what we charge each
            assert v["query_rc"] == "7" and v["query_count"] == "2"  # INSUFFICIENT_SIZE
            assert v["short_rc"] == "7" and v["short_count"] == "2"
            assert v["rc"] == "0" and v["count"] == "2"
            assert _procs(v["procs"]) == expected
    finally:
        _stop(holders)
    # Without a limit the driver's list passes through: everyone on the GPU, the driver's sizes
    # (the mock charges 300 MiB per context).
    free = Env(lib_build, tmp_path / "a", config)
    free.limits_path = tmp_path / "none.conf"
    holders = [_start_workers(c, 1, 64 * MIB)[0] for c in containers]
    try:
        v = ok(free.run("intercept_procs", 100 * MIB))
        procs = _procs(v["procs"])
        assert set(procs) == {holders[0].pid, holders[1].pid, int(v["self"])}
        assert procs[holders[0].pid] == 300 * MIB
        assert procs[int(v["self"])] == 400 * MIB
    finally:
        _stop(holders)


def test_no_limit_passes_through(container: Env) -> None:
    v = ok(container.run("intercept_info", 100 * MIB))  # no limits file, no env
    assert int(v["cu_total"]) == 143771 * MIB
    assert int(v["cu_device_total"]) == 143771 * MIB
    assert int(v["nvml_total"]) == 143771 * MIB


def test_environment_used_only_without_file(container: Env) -> None:
    v = ok(container.run("intercept_info", GPUSHARE_MEM_LIMIT="2GiB"))
    assert int(v["cu_total"]) == 2 * GIB
    v = ok(
        container.run("intercept_info", GPUSHARE_MEM_LIMIT="2GiB", GPUSHARE_MEM_LIMIT_0="512MiB")
    )
    assert int(v["cu_total"]) == 512 * MIB
    # Per-index key in the file wins over the default key.
    container.limits(
        f"memory_limit_bytes=4GiB\nmemory_limit_bytes.0=3GiB\nstate_dir={container.state_dir}\n"
    )
    assert int(ok(container.run("intercept_info"))["cu_total"]) == 3 * GIB


def test_tenant_cannot_override_the_file(container: Env) -> None:
    container.default_limits("1GiB")
    result = container.run(
        "intercept_info", 2 * GIB, GPUSHARE_MEM_LIMIT="100GiB", GPUSHARE_MEM_LIMIT_0="100GiB"
    )
    v = ok(result)
    assert int(v["cu_total"]) == GIB
    assert v["alloc_rc"] == "2"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("memory_limit_bytes=lots\n", "memory_limit_bytes"),
        ("memory_limit_bytes=1GiB\noom_policy=maybe\n", "oom_policy"),
        ("memory_limit_bytes=1GiB\nno_such_key=1\n", "no_such_key"),
        ("memory_limit_bytes.99=1GiB\n", "memory_limit_bytes.99"),
        ("memory_limit_bytes\n", "line 1"),
    ],
)
def test_malformed_limits_refuse_allocations(container: Env, text: str, key: str) -> None:
    container.limits(text)
    result = container.run("intercept_refused")
    v = ok(result)
    assert v == {"ctx_rc": "3", "primary_rc": "3", "alloc_rc": "3"}  # NOT_INITIALIZED
    errors = [line for line in result.stderr.splitlines() if line.startswith("gpushare:")]
    assert len(errors) == 1, result.stderr
    assert str(container.limits_path) in errors[0] and key in errors[0]


def test_malformed_environment_refuses(container: Env) -> None:
    result = container.run("intercept_refused", GPUSHARE_MEM_LIMIT="ten gigs")
    assert ok(result)["alloc_rc"] == "3"
    assert "GPUSHARE_MEM_LIMIT" in result.stderr


# ---- processes sharing one limit -------------------------------------------------------------


def _start_workers(container: Env, count: int, chunk: int) -> list[subprocess.Popen[str]]:
    workers = [container.popen("intercept_worker", chunk) for _ in range(count)]
    for w in workers:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"
    return workers


def _go(worker: subprocess.Popen[str]) -> dict[str, str]:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write("go\n")
    worker.stdin.flush()
    return values(worker.stdout.readline() + worker.stdout.readline())


def _finish(workers: list[subprocess.Popen[str]]) -> None:
    for w in workers:
        out, err = w.communicate("exit\n", timeout=30)
        assert w.returncode == 0, err
        assert out.strip().endswith("done")


@pytest.mark.parametrize("count", [2, 8])
def test_processes_share_one_limit(container: Env, count: int) -> None:
    chunk = 64 * MIB
    blocks = 10 * count + 3
    limit = count * OVERHEAD + blocks * chunk + chunk // 2
    container.default_limits(limit)
    workers = _start_workers(container, count, chunk)
    # All go at once: they race for the same limit.
    for w in workers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    results = [values(w.stdout.readline() + w.stdout.readline()) for w in workers]  # type: ignore[union-attr]
    assert sum(int(r["count"]) for r in results) == blocks
    for r in results:
        assert int(r["used"]) <= limit
    _finish(workers)
    assert int(ok(container.run("intercept_info"))["nvml_used"]) == OVERHEAD


def test_sigkilled_process_usage_is_reclaimed(container: Env) -> None:
    chunk = 64 * MIB
    limit = 2 * OVERHEAD + 20 * chunk
    container.default_limits(limit)
    victim, survivor = _start_workers(container, 2, chunk)
    assert int(_go(victim)["count"]) == 20
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    # The survivor's first refusal reclaims the dead slot (its blocks and its context charge,
    # one more chunk), then it gets everything but its own context charge.
    got = _go(survivor)
    assert int(got["count"]) == 21
    _finish([survivor])
    # A killed process's usage is also reclaimed when a process starts.
    (victim,) = _start_workers(container, 1, chunk)
    assert int(_go(victim)["count"]) == 21
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert int(ok(container.run("intercept_info"))["nvml_used"]) == OVERHEAD
    slots = _slots(container.state_dir / "gpushare.state")
    assert slots == [], slots  # nobody left holding a slot


def _slots(path: Path) -> list[tuple[int, int]]:
    """(pid, used on device 0) of each claimed slot in a version-1 state file."""
    data = path.read_bytes()
    magic, version, header_size, devices, slots, slot_size = struct.unpack_from("<QIIIII", data)
    assert magic == 0x3145544154534753 and version == 1 and header_size == 64
    out = []
    base = header_size + devices * 64
    for i in range(slots):
        tag, _start, used0 = struct.unpack_from("<QQQ", data, base + i * slot_size)
        if tag:
            out.append((tag & 0xFFFFFFFF, used0))
    return out


def test_fork_child_gets_its_own_slot(container: Env) -> None:
    b = 100 * MIB
    container.default_limits(GIB)
    v = ok(container.run("intercept_fork", b))
    assert int(v["parent_used"]) == OVERHEAD + b
    assert int(v["child_used"]) == OVERHEAD + b
    assert v["child_alloc_rc"] == "0"
    assert int(v["child_used_after_alloc"]) == OVERHEAD + 2 * b
    assert int(v["child_after_free"]) == OVERHEAD + b
    assert int(v["parent_after"]) == OVERHEAD + b  # the child's exit did not free the parent's
    assert int(v["parent_end"]) == OVERHEAD


# ---- the state file --------------------------------------------------------------------------


def _header(version: int = 1) -> bytes:
    size = 64 + 16 * 64 + 256 * 144
    fields = struct.pack("<QIIIIIIQQ", 0x3145544154534753, version, 64, 16, 256, 144, 64, size, 0)
    return fields.ljust(64, b"\0")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x7fELF" + b"\x01" * (64 + 16 * 64 + 256 * 144 - 4), "wrong magic"),
        (_header()[:40], "truncated"),
        (_header() + b"\0" * 100, "wrong size"),
        (_header(version=7) + b"\0" * (16 * 64 + 256 * 144), "unsupported version"),
    ],
    ids=["foreign", "truncated", "short-body", "version"],
)
def test_bad_state_file_is_refused(container: Env, content: bytes, problem: str) -> None:
    container.default_limits(GIB)
    container.state_dir.mkdir()
    path = container.state_dir / "gpushare.state"
    path.write_bytes(content)
    result = container.run("intercept_refused")
    v = ok(result)
    assert v == {"ctx_rc": "3", "primary_rc": "3", "alloc_rc": "3"}
    errors = [line for line in result.stderr.splitlines() if line.startswith("gpushare:")]
    assert len(errors) == 1 and str(path) in errors[0] and problem in errors[0], result.stderr
    assert path.read_bytes() == content  # never rewritten


# ---- entry points --------------------------------------------------------------------------


def test_dlsym(container: Env) -> None:
    container.default_limits(GIB)
    v = ok(container.run("intercept_dlsym", 2 * GIB))
    assert v["hooked_alloc_rc"] == "2" and v["small_alloc_rc"] == "0"
    assert v["default_same"] == "1"
    assert v["unhooked_name"] == "NVIDIA H200"
    assert v["unknown_null"] == "1" and v["next_malloc"] == "1"
    assert int(v["nvml_total"]) == GIB


def test_get_proc_address(container: Env) -> None:
    container.default_limits(GIB)
    v = ok(container.run("intercept_procaddress", 2 * GIB))
    cases = [k for k in v if "@" in k]
    assert len(cases) == 30  # 10 (version, flags, entry point) combinations x 3 names
    for key in cases:
        if key.startswith("cuMemGetInfo"):
            assert int(v[key]) == GIB, key
        else:
            assert v[key] == "2", key  # refused: the hook was handed back
    for version in (11030, 12000, 12080):
        for flags in (0, 2):
            assert f"cuMemAlloc@{version}/{flags}/v1" in v
    assert v["unknown_status"] == "1" and v["unknown_null"] == "1"  # SYMBOL_NOT_FOUND
    assert v["unhooked_ok"] == "1"
    assert v["nested_rc"] == "2" and v["nested2_rc"] == "2"


def test_launch_fast_path_is_one_jump(lib_build: Path) -> None:
    objdump = shutil.which("objdump")
    # objdump comes with binutils, which the C compiler needs anyway: its absence is an error.
    assert objdump is not None, "objdump not found: install binutils to check the fast path"
    out = subprocess.run(
        [
            objdump,
            "-d",
            "--no-show-raw-insn",
            "--disassemble=cuLaunchKernel",
            str(lib_build / "libgpushare.so"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    body = out.split("<cuLaunchKernel>:", 1)[1].strip().splitlines()
    instructions = [line.split("\t", 1)[1] for line in body if "\t" in line]
    assert instructions[0].startswith("jmp") and "*" in instructions[0], out


def test_exports_only_hooks(lib_build: Path) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib_build / "libgpushare.so")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert "dlsym" in names and "cuMemAlloc_v2" in names and "cuGetProcAddress_v2" in names
    assert all(n == "dlsym" or n.startswith(("cu", "nvml")) for n in names), names
    # Only the testing build knows the test-only limits path variable.
    assert b"GPUSHARE_TEST_LIMITS_PATH" not in (lib_build / "libgpushare.so").read_bytes()
    assert b"GPUSHARE_TEST_LIMITS_PATH" in (lib_build / "testing" / "libgpushare.so").read_bytes()


# ---- compute limit -------------------------------------------------------------------------


def _launch_env(lib_build: Path, tmp_path: Path, mock_config: Callable[..., Path]) -> Env:
    # A short utilisation window so the feedback settles within the run.
    env = Env(lib_build, tmp_path, mock_config(devices=DEVICES, utilization_window_ms=200))
    env.default_limits(GIB, core_limit_percent=30)
    return env


def test_core_limit_converges(
    lib_build: Path, tmp_path: Path, mock_config: Callable[..., Path]
) -> None:
    env = _launch_env(lib_build, tmp_path, mock_config)
    v = ok(env.run("intercept_launch", 3000, 1000))
    # Starts from a 100 us guess for 1 ms kernels; after the feedback, ~30% of GPU time.
    assert 24.0 <= float(v["late_share_percent"]) <= 36.0, v


def test_core_limit_is_shared_by_processes(
    lib_build: Path, tmp_path: Path, mock_config: Callable[..., Path]
) -> None:
    env = _launch_env(lib_build, tmp_path, mock_config)
    procs = [
        subprocess.Popen(
            [str(lib_build / "tests" / "intercept_launch"), "3000", "1000"],
            env=env.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    shares = []
    for p in procs:
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        shares.append(float(values(out)["late_share_percent"]))
    assert 24.0 <= sum(shares) <= 36.0, shares


def test_core_limit_holds_for_graphs(
    lib_build: Path, tmp_path: Path, mock_config: Callable[..., Path]
) -> None:
    # Graph launches of 10 x 1 ms kernels: only graphs; alternating with single 1 ms kernels;
    # and 400 ms phases of each, where one estimate shared by both kinds would be dragged to the
    # kernel cost in every kernel phase and let the next graph phase run far over the limit.
    # Three independent containers, each with its own mock GPU, run at the same time.
    runs = {}
    for pattern in ("graph", "alt", "phases"):
        (tmp_path / pattern).mkdir()
        config = tmp_path / pattern / "mock.json"
        config.write_bytes(mock_config(devices=DEVICES, utilization_window_ms=200).read_bytes())
        env = Env(lib_build, tmp_path / pattern, config)
        env.default_limits(GIB, core_limit_percent=30)
        runs[pattern] = subprocess.Popen(
            [str(lib_build / "tests" / "intercept_graph"), "4000", "1000", "10", pattern],
            env=env.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for pattern, p in runs.items():
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        results[pattern] = values(out)
    for pattern, v in results.items():
        assert 24.0 <= float(v["late_share_percent"]) <= 36.0, (pattern, v)
    phases = results["phases"]
    assert 24.0 <= float(phases["late_graph_share_percent"]) <= 36.0, phases
    assert 24.0 <= float(phases["late_kernel_share_percent"]) <= 36.0, phases


def test_no_core_limit_does_not_throttle(container: Env) -> None:
    container.default_limits(GIB)
    v = ok(container.run("intercept_launch", 300, 1000))
    assert float(v["share_percent"]) > 80.0, v


# ---- sanitizers ----------------------------------------------------------------------------


def test_asan_ubsan(tmp_path: Path, mock_config: Callable[..., Path]) -> None:
    build = _make("build/asan", SAN["asan"])
    # Two devices: intercept_pooldev allocates on device 1 with a device-0 context current.
    devices = [*DEVICES, dict(DEVICES[0], uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")]
    env = Env(build, tmp_path, mock_config(devices=devices), preload=_runtime("asan"))
    env.default_limits(GIB)
    for program, args in [
        ("intercept_alloc", ("alloc", 600 * MIB)),
        ("intercept_alloc", ("async", 600 * MIB)),
        ("intercept_alloc", ("mipmap", 600 * MIB)),
        ("intercept_dlsym", (2 * GIB,)),
        ("intercept_procaddress", (2 * GIB,)),
        ("intercept_legacy", ("alloc", 2 * GIB)),
        ("intercept_legacy", ("procaddress", 2 * GIB)),
        ("intercept_pooldev", ("stream", 2 * GIB)),
        ("intercept_pooldev", ("created", 2 * GIB)),
        ("intercept_fork", (100 * MIB,)),
        ("intercept_stress", (4, 500, 64 * MIB)),
        ("intercept_launch", (200, 1000)),
        ("intercept_procs", (100 * MIB,)),
    ]:
        result = env.run(program, *args, ASAN_OPTIONS="detect_leaks=1")
        assert result.returncode == 0, f"{program}: {result.stderr}"
        assert "runtime error" not in result.stderr and "AddressSanitizer" not in result.stderr


def test_tsan_stress(tmp_path: Path, mock_config: Callable[..., Path]) -> None:
    build = _make("build/tsan", SAN["tsan"])
    env = Env(build, tmp_path, mock_config(devices=DEVICES), preload=_runtime("tsan"))
    env.default_limits(OVERHEAD + 10 * 64 * MIB)
    result = env.run(
        "intercept_stress", 8, 2000, 64 * MIB, TSAN_OPTIONS="halt_on_error=1", timeout=60
    )
    v = ok(result)
    assert "ThreadSanitizer" not in result.stderr, result.stderr
    assert int(v["refused"]) > 0 and int(v["ok"]) > 0  # the limit was actually contended
    assert v["used_before"] == v["used_after"]
    # The compute limiter (sampler thread + shared bucket) under TSan too.
    env.default_limits(GIB, core_limit_percent=30)
    result = env.run("intercept_launch", 600, 1000, TSAN_OPTIONS="halt_on_error=1", timeout=60)
    ok(result)
    assert "ThreadSanitizer" not in result.stderr, result.stderr
    result = env.run(
        "intercept_graph", 600, 1000, 10, "alt", TSAN_OPTIONS="halt_on_error=1", timeout=60
    )
    ok(result)
    assert "ThreadSanitizer" not in result.stderr, result.stderr
