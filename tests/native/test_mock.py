"""The mock CUDA driver and NVML (native/mock): devices, accounting across processes, pools,
VMM, arrays, cuGetProcAddress, the kernel timeline and NVML utilisation, config errors."""

from __future__ import annotations

import subprocess
import time

import pytest

MIB = 1024 * 1024


def parse_kv(output: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in output.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def run_ok(run_mock, program, *args, config, **kwargs) -> dict[str, str]:
    result = run_mock(program, *args, config=config, **kwargs)
    assert result.returncode == 0, f"{program} failed:\n{result.stdout}\n{result.stderr}"
    return parse_kv(result.stdout)


def wait_ready(process: subprocess.Popen[str]) -> int:
    line = process.stdout.readline()
    assert line.startswith("ready"), f"not ready: {line!r} {process.stderr.read()}"
    return int(line.split("pid=")[1])


@pytest.fixture
def basic(run_mock, mock_config) -> dict[str, str]:
    values = run_ok(run_mock, "mock_basic", config=mock_config())
    assert values["failures"] == "0"
    return values


def test_device_listing(basic):
    assert basic["driver_version"] == "12080"
    assert basic["device_count"] == "2"
    assert basic["device0_name"] == "NVIDIA H200"
    assert basic["device0_sm_count"] == "132"
    assert int(basic["device0_total_bytes"]) == 1024 * MIB
    assert basic["device0_uuid_byte0"] == "12"
    assert basic["device1_name"] == "NVIDIA A100-SXM4-80GB"
    assert int(basic["device1_total_bytes"]) == 2048 * MIB
    assert basic["device1_uuid_byte0"] == "aa"
    assert basic["nvml_count"] == "2"
    assert basic["nvml_uuid"] == "GPU-12345678-1234-1234-1234-123456789abc"
    assert basic["func_max_threads"] == "1024"  # a call gpushare does not intercept


def test_memory_accounting_includes_context_overhead(basic):
    assert int(basic["ctx_overhead_bytes"]) == 300 * MIB
    assert int(basic["primary_overhead_bytes"]) == 300 * MIB
    assert int(basic["free_with_context"]) == (1024 - 300) * MIB
    assert basic["pitch_for_1000"] == "1024"
    assert int(basic["released_on_destroy"]) == (64 + 300) * MIB
    assert int(basic["nvml_process_used"]) == (300 + 5) * MIB


def test_pools_vmm_and_arrays(basic):
    assert int(basic["pool_reserved_after_3mib"]) == 4 * MIB
    assert int(basic["pool_reserved_after_free"]) == 6 * MIB
    assert basic["pool_reserved_after_trim"] == "0"
    assert int(basic["vmm_granularity"]) == 2 * MIB
    assert int(basic["vmm_device_charged"]) == 8 * MIB
    assert int(basic["vmm_after_host"]) == 8 * MIB  # host location: no device memory
    assert int(basic["array2d_bytes"]) == 1024 * 512 * 4 * 4
    assert int(basic["array3d_bytes"]) == 64 * 64 * 8 * 2 * 2
    assert int(basic["array1d_bytes"]) == 100
    assert int(basic["mipmap3_bytes"]) == (256 * 256 + 128 * 128 + 64 * 64) * 4


def test_out_of_memory_past_capacity(run_mock, mock_config):
    result = run_mock("mock_hold", "0", "800", config=mock_config())  # 300 overhead + 800 > 1024
    assert result.returncode == 1
    assert "cuMemAlloc_v2" in result.stderr and "returned 2" in result.stderr


def test_two_processes_share_device_memory(run_mock, popen_mock, mock_config):
    config = mock_config()
    holder = popen_mock("mock_hold", "0", "200", config=config)
    pid = wait_ready(holder)
    seen = run_ok(run_mock, "mock_query", "0", config=config)
    assert int(seen["nvml_used"]) == 500 * MIB
    assert seen["nvml_processes"] == "1"
    assert seen["nvml_pids"] == f"{pid}:{500 * MIB}"
    assert int(seen["cuda_free"]) == (1024 - 500 - 300) * MIB
    assert int(seen["nvml_used_with_own_context"]) == 800 * MIB
    # A second process competes for what is left: 224 MiB after its own context.
    assert run_mock("mock_hold", "0", "300", config=config).returncode == 1
    holder.stdin.write("release\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "done"
    assert holder.wait(timeout=10) == 0
    after = run_ok(run_mock, "mock_query", "0", config=config)
    assert after["nvml_used"] == "0"
    assert after["nvml_processes"] == "0"


def test_killed_process_memory_is_reclaimed(run_mock, popen_mock, mock_config):
    config = mock_config()
    holder = popen_mock("mock_hold", "1", "1000", config=config)
    wait_ready(holder)
    assert int(run_ok(run_mock, "mock_query", "1", config=config)["nvml_used"]) == 1300 * MIB
    holder.kill()
    holder.wait(timeout=10)
    after = run_ok(run_mock, "mock_query", "1", config=config)
    assert after["nvml_used"] == "0"
    assert after["nvml_processes"] == "0"


@pytest.mark.parametrize(
    ("symbol", "version", "flags", "status", "export"),
    [
        ("cuMemAlloc", 12000, 0, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 3020, 0, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 3000, 0, 0, "cuMemAlloc"),  # the legacy 32-bit ABI
        ("cuMemAllocPitch", 2000, 0, 0, "cuMemAllocPitch"),
        ("cuMemFree", 3010, 0, 0, "cuMemFree"),
        ("cuMemGetInfo", 3000, 0, 0, "cuMemGetInfo"),
        ("cuDeviceTotalMem", 3000, 0, 0, "cuDeviceTotalMem"),
        ("cuArrayCreate", 3000, 0, 0, "cuArrayCreate"),
        ("cuArray3DCreate", 3000, 0, 0, "cuArray3DCreate"),
        ("cuCtxDestroy", 3020, 0, 0, "cuCtxDestroy"),
        ("cuCtxDestroy", 4000, 0, 0, "cuCtxDestroy_v2"),
        ("cuMemAlloc", 1000, 0, 2, "NULL"),  # older than any export
        ("cuMemGetInfo", 11000, 0, 0, "cuMemGetInfo_v2"),
        ("cuCtxCreate", 3000, 0, 0, "cuCtxCreate"),
        ("cuCtxCreate", 11030, 0, 0, "cuCtxCreate_v2"),
        ("cuCtxCreate", 11040, 0, 0, "cuCtxCreate_v3"),
        ("cuCtxCreate", 12040, 0, 0, "cuCtxCreate_v3"),
        ("cuCtxCreate", 12050, 0, 0, "cuCtxCreate_v4"),
        ("cuCtxCreate", 12080, 0, 0, "cuCtxCreate_v4"),
        ("cuStreamGetCtx", 12000, 0, 0, "cuStreamGetCtx"),
        ("cuMemPoolCreate", 12000, 0, 0, "cuMemPoolCreate"),
        ("cuDeviceGetMemPool", 12000, 0, 0, "cuDeviceGetMemPool"),
        ("cuLaunchKernel", 12000, 0, 0, "cuLaunchKernel"),
        ("cuLaunchKernel", 12000, 1, 0, "cuLaunchKernel"),
        ("cuLaunchKernel", 12000, 2, 0, "cuLaunchKernel_ptsz"),
        ("cuLaunchKernelEx", 12000, 2, 0, "cuLaunchKernelEx_ptsz"),
        ("cuLaunchKernelEx", 11000, 0, 2, "NULL"),
        ("cuStreamSynchronize", 12000, 2, 0, "cuStreamSynchronize_ptsz"),
        ("cuMemGetInfo", 12000, 2, 0, "cuMemGetInfo_v2"),  # no _ptsz variant: the plain one
        ("cuGetProcAddress", 11030, 0, 0, "cuGetProcAddress"),
        ("cuGetProcAddress", 12000, 0, 0, "cuGetProcAddress_v2"),
        ("cuDevicePrimaryCtxRelease", 11000, 0, 0, "cuDevicePrimaryCtxRelease_v2"),
        ("cuDevicePrimaryCtxRelease", 10020, 0, 0, "cuDevicePrimaryCtxRelease"),
        ("cuDeviceGetName", 12000, 0, 0, "cuDeviceGetName"),
        ("cuNoSuchFunction", 12000, 0, 1, "NULL"),
    ],
)
def test_get_proc_address(run_mock, mock_config, symbol, version, flags, status, export):
    values = run_ok(
        run_mock, "mock_procaddr", symbol, str(version), str(flags), config=mock_config()
    )
    assert values["rc_v2"] == "0"
    assert values["status"] == str(status)
    assert values["export"] == export
    assert values["rc_v1"] == ("0" if status == 0 else "500")  # CUDA_ERROR_NOT_FOUND


def test_get_proc_address_rejects_future_versions_and_bad_flags(run_mock, mock_config):
    config = mock_config(driver_version=12020)
    assert run_ok(run_mock, "mock_procaddr", "cuMemAlloc", "12080", "0", config=config) == {
        "rc_v2": "1",
        "status": "-1",
        "export": "NULL",
        "rc_v1": "1",
    }
    assert (
        run_ok(run_mock, "mock_procaddr", "cuMemAlloc", "12000", "7", config=config)["rc_v2"] == "1"
    )


def test_kernel_launches_queue_on_the_timeline(run_mock, mock_config):
    values = run_ok(run_mock, "mock_timeline", "queue", "5", "20000", config=mock_config())
    assert float(values["launch_ms"]) < 10  # launches return at once
    assert 95 <= float(values["sync_ms"]) < 200  # synchronising waits for all five
    graph = run_ok(run_mock, "mock_timeline", "graph", "8", config=mock_config())
    assert 7.5 <= float(graph["sync_ms"]) < 100  # 8 kernels of kernel_time_us=1000


def test_timeline_is_shared_across_processes(run_mock, popen_mock, mock_config):
    config = mock_config()
    busy = popen_mock("mock_hold", "0", "0", "300000", config=config)  # queues a 300 ms kernel
    wait_ready(busy)
    values = run_ok(run_mock, "mock_timeline", "queue", "1", "1000", config=config)
    assert float(values["sync_ms"]) >= 200  # queued behind the other process's kernel
    busy.stdin.write("release\n")
    busy.stdin.flush()
    assert busy.wait(timeout=10) == 0


def test_nvml_utilisation_follows_duty_cycle(run_mock, mock_config):
    config = mock_config(utilization_window_ms=500)
    values = run_ok(run_mock, "mock_timeline", "duty", "10000", "10000", "35", config=config)
    assert 40 <= int(values["nvml_util"]) <= 60


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot open config file"),
        ('{"devices": [', "not valid JSON"),
        ('{"devices": []}', '"devices" must be an array'),
        (
            '{"devices": [{"name": "x", "uuid": "GPU-1", "memory_mib": 1, "sm_count": 1}]}',
            '"uuid" must look like',
        ),
        (
            '{"devices": [{"name": "x", "uuid": "GPU-12345678-1234-1234-1234-123456789abc",'
            ' "sm_count": 1}]}',
            'missing "memory_mib"',
        ),
        ('{"driver_version": "new", "devices": []}', '"driver_version" must be'),
    ],
)
def test_bad_config_is_a_clear_error(run_mock, tmp_path, content, problem):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    result = run_mock("mock_init", config=path)
    assert result.returncode == 0
    assert parse_kv(result.stdout) == {
        "cu_init": "100",
        "cu_device_count_rc": "3",
        "nvml_init": "9",
    }
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2  # one line from each library
    assert all(str(path) in line and problem in line for line in lines), lines


def test_unset_config_is_a_clear_error(run_mock):
    result = run_mock("mock_init", config=None)
    assert parse_kv(result.stdout)["cu_init"] == "100"
    assert "GPUSHARE_MOCK_CONFIG is not set" in result.stderr


def test_basic_under_asan_and_ubsan(run_mock, mock_config, native_asan_build):
    values = run_ok(
        run_mock, "mock_basic", config=mock_config(), build=native_asan_build, timeout=60
    )
    assert values["failures"] == "0"


# -- discovery and health: what the device plugin asks NVML (native/mock/nvml_node.c) --------

NODE_DEVICES = [
    {
        "name": "NVIDIA H200",
        "uuid": "GPU-12345678-1234-1234-1234-123456789abc",
        "memory_mib": 1024,
        "sm_count": 132,
        "numa": 1,
        "pci_bus_id": "00000000:3B:00.0",
        "nvlink_peers": [1, 1],
    },
    {
        "name": "NVIDIA H200",
        "uuid": "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        "memory_mib": 1024,
        "sm_count": 132,
        "numa": -1,
        "nvlink_peers": [0],
    },
    {
        "name": "NVIDIA H200",
        "uuid": "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeef",
        "memory_mib": 1024,
        "sm_count": 132,
    },
]


def test_discovery_reports_pci_numa_and_nvlink(run_mock, mock_config):
    values = run_ok(
        run_mock, "mock_node", config=mock_config(NODE_DEVICES, nvml_driver_version="570.1")
    )
    assert values["failures"] == "0"
    assert values["driver_version"] == "570.1"
    assert values["device0_bus_id"] == "00000000:3B:00.0"
    assert values["device1_bus_id"] == "00000000:11:00.0"  # default: bus 0x10 + index
    assert values["device0_numa"] == "1"
    assert values["device1_numa"] == "error3"  # numa -1: NOT_SUPPORTED, as without affinity
    assert values["device2_numa"] == "0"
    assert values["device0_nvlink"] == "00000000:11:00.0,00000000:11:00.0"  # two links to 1
    assert values["device1_nvlink"] == "00000000:3B:00.0"
    assert values["device2_nvlink"] == "error3"  # no NVLink: NOT_SUPPORTED


def test_xid_events_and_pending_retirement_in_process(run_mock, mock_config):
    values = run_ok(run_mock, "mock_node", config=mock_config(NODE_DEVICES))
    assert values["failures"] == "0"
    assert values["supported_events"] == "8"  # nvmlEventTypeXidCriticalError
    assert (values["first_xid"], values["second_xid"]) == ("79", "48")  # in order, not 31
    assert values["first_type"] == "8"
    assert (values["pending_before"], values["pending_set"], values["pending_cleared"]) == (
        "0",
        "1",
        "0",
    )


def test_xid_injected_by_another_process_wakes_a_waiter(run_mock, popen_mock, mock_config):
    config = mock_config(NODE_DEVICES)
    waiter = popen_mock("mock_node", "wait", "10000", config=config)
    line = waiter.stdout.readline()
    assert line.strip() == "ready", waiter.stderr.read()
    injected = run_mock("mock_node", "inject", "2", "94", config=config)
    assert injected.returncode == 0, injected.stderr
    out, err = waiter.communicate(timeout=20)
    values = parse_kv(out)
    assert values == {"event_result": "0", "event_device": "2", "event_xid": "94"}, err


def test_waiting_without_events_times_out(run_mock, popen_mock, mock_config):
    waiter = popen_mock("mock_node", "wait", "50", config=mock_config(NODE_DEVICES))
    out, err = waiter.communicate(timeout=20)
    assert parse_kv(out)["event_result"] == "10", err  # NVML_ERROR_TIMEOUT


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("numa", "x", '"numa" must be a whole number'),
        ("pci_bus_id", "3b:00.0", '"pci_bus_id" must look like'),
        ("nvlink_peers", [0], '"nvlink_peers" entries must be indices of other devices'),
        ("nvlink_peers", [7], '"nvlink_peers": no device 7'),
        ("nvlink_peers", 1, '"nvlink_peers" must be an array'),
    ],
)
def test_bad_discovery_config_is_a_clear_error(run_mock, mock_config, field, value, problem):
    device = dict(NODE_DEVICES[2], **{field: value})
    result = run_mock("mock_node", config=mock_config([device, NODE_DEVICES[1]]))
    assert result.returncode == 1
    assert problem in result.stderr, result.stderr


def test_node_calls_under_asan_and_ubsan(run_mock, mock_config, native_asan_build):
    values = run_ok(
        run_mock,
        "mock_node",
        config=mock_config(NODE_DEVICES),
        build=native_asan_build,
        timeout=60,
    )
    assert values["failures"] == "0"


# -- per-process utilisation: nvmlDeviceGetProcessUtilization from the kernel timeline ---------


def test_process_utilisation_contract(run_mock, mock_config):
    values = run_ok(run_mock, "mock_procutil", "api", config=mock_config())
    assert values["failures"] == "0"  # uninitialised, NULL count and bad handle rejected
    assert values["size_query_count"] == "1"  # NULL buffer: INSUFFICIENT_SIZE and the count
    assert values["small_buffer_count"] == "1"
    assert values["samples"] == "1"
    assert values["pid_is_self"] == "1"
    # A 50 ms kernel, asked since just before it: its share of the period since then.
    period_us = int(values["period_us"])
    assert period_us >= 50000
    assert abs(int(values["sm_util"]) - 100 * 50000 / period_us) <= 1.5
    assert values["mem_enc_dec"] == "0"
    assert values["timestamp_in_call"] == "1"  # CLOCK_REALTIME microseconds
    assert values["after_last_seen_rc"] == "6"  # NOT_FOUND: nothing ran since that sample
    assert values["after_last_seen_count"] == "0"
    assert values["future_rc"] == "6"
    assert values["other_device_rc"] == "6"
    # lastSeenTimeStamp 0: over utilization_window_ms (1000), as the device's utilisation.
    assert values["since_zero_samples"] == "1"
    assert 1 <= int(values["since_zero_sm_util"]) <= 6  # 50 ms of the last 1000
    assert abs(int(values["since_zero_sm_util"]) - int(values["device_util"])) <= 1


def test_back_to_back_kernels_of_two_processes_stay_apart(run_mock, mock_config):
    config = mock_config(utilization_window_ms=60000)
    values = run_ok(run_mock, "mock_procutil", "split", "200000", "100000", config=config)
    assert values["failures"] == "0"
    assert float(values["parent_wait_ms"]) >= 250  # queued right behind the child's kernel
    assert values["samples"] == "2"
    child, parent = int(values["child_util"]), int(values["parent_util"])
    # 200 ms against 100 ms (each rounded to a percent), not one merged interval.
    assert parent >= 5 and abs(child - 2 * parent) <= 1.5
    assert child + parent <= 100


def test_process_utilisation_reflects_each_process_share(run_mock, popen_mock, mock_config):
    config = mock_config(utilization_window_ms=60000)
    since = time.time_ns() // 1000
    heavy = popen_mock("mock_hold", "0", "0", "300000", config=config)  # queues 300 ms
    heavy_pid = wait_ready(heavy)
    run_ok(run_mock, "mock_timeline", "queue", "1", "100000", config=config)  # 100 ms, synced
    seen = run_ok(run_mock, "mock_procutil", "query", "0", str(since), config=config)
    assert seen["rc"] == "0"
    assert seen["samples"] == "2"
    util = {int(p): int(u) for p, u, _ in (s.split(":") for s in seen["pids"].split(","))}
    light_util = next(u for p, u in util.items() if p != heavy_pid)
    # 300 ms against 100 ms, each rounded to a percent of the period since `since`.
    assert light_util >= 1 and abs(util[heavy_pid] - 3 * light_util) <= 2
    assert util[heavy_pid] + light_util <= 100
    other = run_ok(run_mock, "mock_procutil", "query", "1", str(since), config=config)
    assert other["rc"] == "6"  # nothing ran on device 1: NOT_FOUND
    heavy.stdin.write("release\n")
    heavy.stdin.flush()
    assert heavy.wait(timeout=10) == 0


def test_process_utilisation_under_asan_and_ubsan(run_mock, mock_config, native_asan_build):
    for args in (("api",), ("split", "20000", "10000")):
        values = run_ok(
            run_mock,
            "mock_procutil",
            *args,
            config=mock_config(),
            build=native_asan_build,
            timeout=60,
        )
        assert values["failures"] == "0", args
