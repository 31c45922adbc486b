/*
 * Exercises every entry point of the mock CUDA driver and NVML on device 0 of the configured
 * mock, printing key=value lines; exits non-zero on any unexpected result. Expects a fresh state
 * file (no other process using the device).
 */
#include "gpushare/driver_types.h"
#include "mock_check.h"

#include <string.h>
#include <unistd.h>

static unsigned long long nvml_used(nvmlDevice_t device)
{
    nvmlMemory_t memory = {0};
    EXPECT(nvmlDeviceGetMemoryInfo(device, &memory), NVML_SUCCESS);
    return memory.used;
}

static size_t cuda_free(void)
{
    size_t free_bytes = 0, total = 0;
    EXPECT(cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
    return free_bytes;
}

static void before_init(void)
{
    int count = 0;
    CUdevice device = 0;
    size_t a = 0, b = 0;
    CUdeviceptr pointer = 0;
    EXPECT(cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuDeviceGet(&device, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuMemGetInfo_v2(&a, &b), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuMemAlloc_v2(&pointer, 1), CUDA_ERROR_NOT_INITIALIZED);
    int version = 0;
    EXPECT(cuDriverGetVersion(&version), CUDA_SUCCESS); /* works before cuInit */
    EXPECT(cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    unsigned int n = 0;
    EXPECT(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);
}

static void devices(void)
{
    int count = 0, version = 0, sms = 0;
    EXPECT(cuDriverGetVersion(&version), CUDA_SUCCESS);
    EXPECT(cuDeviceGetCount(&count), CUDA_SUCCESS);
    EXPECT(cuDeviceGetCount(NULL), CUDA_ERROR_INVALID_VALUE);
    KV("driver_version", "%d", version);
    KV("device_count", "%d", count);
    for (int i = 0; i < count; i++) {
        CUdevice device = -1;
        char name[128] = "", key[64];
        unsigned char uuid[16] = {0};
        size_t total = 0;
        EXPECT(cuDeviceGet(&device, i), CUDA_SUCCESS);
        EXPECT(cuDeviceGetName(name, sizeof name, device), CUDA_SUCCESS);
        EXPECT(cuDeviceGetUuid(uuid, device), CUDA_SUCCESS);
        EXPECT(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
               CUDA_SUCCESS);
        EXPECT(cuDeviceTotalMem_v2(&total, device), CUDA_SUCCESS);
        snprintf(key, sizeof key, "device%d_name", i);
        KV(key, "%s", name);
        snprintf(key, sizeof key, "device%d_sm_count", i);
        KV(key, "%d", sms);
        snprintf(key, sizeof key, "device%d_total_bytes", i);
        KV(key, "%zu", total);
        snprintf(key, sizeof key, "device%d_uuid_byte0", i);
        KV(key, "%02x", uuid[0]);
    }
    CUdevice device = 0;
    EXPECT(cuDeviceGet(&device, count), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    char name[8];
    EXPECT(cuDeviceGetName(name, sizeof name, count), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, -1),
           CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceTotalMem_v2(NULL, 0), CUDA_ERROR_INVALID_VALUE);
}

static void contexts(nvmlDevice_t nvml0)
{
    CUcontext context = NULL, current = NULL, primary = NULL, again = NULL;
    CUdevice device = -1;
    size_t a = 0, b = 0;
    EXPECT(cuCtxGetDevice(&device), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuMemGetInfo_v2(&a, &b), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    unsigned long long before = nvml_used(nvml0);
    EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
    KV("ctx_overhead_bytes", "%llu", nvml_used(nvml0) - before);
    EXPECT(cuCtxGetCurrent(&current), CUDA_SUCCESS);
    EXPECT_TRUE(current == context);
    EXPECT(cuCtxGetDevice(&device), CUDA_SUCCESS);
    EXPECT(device, 0);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT(cuCtxCreate_v2(NULL, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuCtxCreate_v2(&current, 0, 99), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    EXPECT(nvml_used(nvml0), before);
    EXPECT(cuCtxGetCurrent(&current), CUDA_SUCCESS);
    EXPECT_TRUE(current == NULL);
    EXPECT(cuCtxDestroy_v2(context), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxSetCurrent(context), CUDA_ERROR_INVALID_CONTEXT);

    EXPECT(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
    unsigned long long one = nvml_used(nvml0);
    EXPECT(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
    EXPECT_TRUE(primary == again);
    EXPECT(nvml_used(nvml0), one); /* a second retain costs nothing */
    KV("primary_overhead_bytes", "%llu", one - before);
    EXPECT(cuCtxDestroy_v2(primary), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    EXPECT(nvml_used(nvml0), before);
    EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuDevicePrimaryCtxRelease_v2(99), CUDA_ERROR_INVALID_DEVICE);
}

static void memory(nvmlDevice_t nvml0)
{
    CUcontext context = NULL;
    CUdeviceptr pointer = 0, second = 0, managed = 0, pitched = 0;
    size_t pitch = 0, total = 0, free_bytes = 0;
    EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
    EXPECT(cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
    EXPECT(total - free_bytes, nvml_used(nvml0));
    KV("free_with_context", "%zu", free_bytes);
    EXPECT(cuMemAlloc_v2(&pointer, 10 * MIB), CUDA_SUCCESS);
    EXPECT(cuda_free(), free_bytes - 10 * MIB);
    EXPECT(cuMemAlloc_v2(&second, 1), CUDA_SUCCESS);
    EXPECT_TRUE(pointer != 0 && second != 0 && pointer != second);
    EXPECT(cuMemAlloc_v2(NULL, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAlloc_v2(&pointer, 0) == CUDA_SUCCESS, 0);
    EXPECT(cuMemAllocPitch_v2(&pitched, &pitch, 1000, 3, 4), CUDA_SUCCESS);
    EXPECT(pitch, 1024);
    KV("pitch_for_1000", "%zu", pitch);
    EXPECT(cuMemAllocPitch_v2(&pitched, &pitch, 1000, 3, 3), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocManaged(&managed, 4 * MIB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemAllocManaged(&managed, 4 * MIB, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuda_free(), free_bytes - 10 * MIB - 1 - 3 * 1024 - 4 * MIB);
    /* Out of memory past the device's capacity, and nothing charged for the failure. */
    CUdeviceptr huge = 0;
    size_t now_free = cuda_free();
    EXPECT(cuMemAlloc_v2(&huge, now_free + 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cuda_free(), now_free);
    EXPECT(cuMemAlloc_v2(&huge, now_free), CUDA_SUCCESS);
    EXPECT(cuda_free(), 0);
    EXPECT(cuMemFree_v2(huge), CUDA_SUCCESS);
    EXPECT(cuMemFree_v2(huge), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree_v2(0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree_v2(pointer), CUDA_SUCCESS);
    EXPECT(cuMemFree_v2(second), CUDA_SUCCESS);
    EXPECT(cuMemFree_v2(pitched), CUDA_SUCCESS);
    EXPECT(cuMemFree_v2(managed), CUDA_SUCCESS);
    EXPECT(cuda_free(), free_bytes);
    /* Destroying a context frees what was allocated in it. */
    EXPECT(cuMemAlloc_v2(&pointer, 64 * MIB), CUDA_SUCCESS);
    unsigned long long used_before = nvml_used(nvml0);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    KV("released_on_destroy", "%llu", used_before - nvml_used(nvml0));
    EXPECT(nvml_used(nvml0), 0);
    EXPECT(cuMemAlloc_v2(&pointer, 1), CUDA_ERROR_INVALID_CONTEXT);
}

static void pools(void)
{
    CUcontext context = NULL;
    CUmemoryPool pool = NULL;
    CUdeviceptr a = 0, b = 0, c = 0;
    cuuint64_t reserved = 0, used = 0;
    EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
    size_t base = cuda_free();
    EXPECT(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetDefaultMemPool(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGetDefaultMemPool(&pool, 99), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuMemAllocAsync(&a, 3 * MIB, NULL), CUDA_SUCCESS);
    EXPECT(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
           CUDA_SUCCESS);
    KV("pool_reserved_after_3mib", "%llu", (unsigned long long)reserved);
    EXPECT(reserved, 4 * MIB);
    EXPECT(cuda_free(), base - 4 * MIB);
    EXPECT(cuMemAllocFromPoolAsync(&b, 1 * MIB, pool, NULL), CUDA_SUCCESS); /* fits */
    EXPECT(cuMemAllocAsync_ptsz(&c, 1 * MIB, NULL), CUDA_SUCCESS);          /* grows */
    EXPECT(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
           CUDA_SUCCESS);
    EXPECT(reserved, 6 * MIB);
    EXPECT(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    EXPECT(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    EXPECT(cuMemFreeAsync_ptsz(c, NULL), CUDA_SUCCESS);
    EXPECT(cuMemFreeAsync(c, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used), CUDA_SUCCESS);
    EXPECT(used, 0);
    EXPECT(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
           CUDA_SUCCESS);
    KV("pool_reserved_after_free", "%llu", (unsigned long long)reserved);
    EXPECT(cuda_free(), base - 6 * MIB); /* freed memory stays reserved */
    EXPECT(cuMemPoolTrimTo(pool, 2 * MIB), CUDA_SUCCESS);
    EXPECT(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
           CUDA_SUCCESS);
    EXPECT(reserved, 2 * MIB);
    EXPECT(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    EXPECT(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
           CUDA_SUCCESS);
    KV("pool_reserved_after_trim", "%llu", (unsigned long long)reserved);
    EXPECT(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &reserved),
           CUDA_SUCCESS);
    EXPECT(reserved, 6 * MIB);
    EXPECT(cuda_free(), base);
    EXPECT(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, NULL),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolGetAttribute(NULL, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocAsync(&a, base + 1, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cuMemAllocAsync(&a, 1, (CUstream)0x1234), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    EXPECT(cuMemAllocAsync(&a, 1, NULL), CUDA_ERROR_INVALID_CONTEXT);
}

static void vmm_and_arrays(void)
{
    CUcontext context = NULL;
    EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
    size_t base = cuda_free(), granularity = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle device_handle = 0, host_handle = 0;
    EXPECT(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_SUCCESS);
    KV("vmm_granularity", "%zu", granularity);
    EXPECT(cuMemCreate(&device_handle, 8 * MIB, &prop, 0), CUDA_SUCCESS);
    KV("vmm_device_charged", "%zu", base - cuda_free());
    EXPECT(cuMemCreate(&device_handle, 8 * MIB + 1, &prop, 0) == CUDA_SUCCESS, 0);
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    EXPECT(cuMemCreate(&host_handle, 8 * MIB, &prop, 0), CUDA_SUCCESS);
    KV("vmm_after_host", "%zu", base - cuda_free());
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 42;
    EXPECT(cuMemCreate(&host_handle, 8 * MIB, &prop, 0) == CUDA_SUCCESS, 0);
    EXPECT(cuMemCreate(&host_handle, 8 * MIB, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemRelease(device_handle), CUDA_SUCCESS);
    EXPECT(cuMemRelease(device_handle), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuda_free(), base);

    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = 1024, .Height = 512, .Format = CU_AD_FORMAT_FLOAT,
                                .NumChannels = 4};
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = 64, .Height = 64, .Depth = 8,
                                  .Format = CU_AD_FORMAT_HALF, .NumChannels = 2};
    CUarray array2 = NULL, array3 = NULL, array1 = NULL;
    CUmipmappedArray mip = NULL;
    EXPECT(cuArrayCreate_v2(&array2, &d2), CUDA_SUCCESS);
    KV("array2d_bytes", "%zu", base - cuda_free());
    size_t mark = cuda_free();
    EXPECT(cuArray3DCreate_v2(&array3, &d3), CUDA_SUCCESS);
    KV("array3d_bytes", "%zu", mark - cuda_free());
    mark = cuda_free();
    CUDA_ARRAY3D_DESCRIPTOR d1 = {.Width = 100, .Format = CU_AD_FORMAT_UNSIGNED_INT8,
                                  .NumChannels = 1};
    EXPECT(cuArray3DCreate_v2(&array1, &d1), CUDA_SUCCESS);
    KV("array1d_bytes", "%zu", mark - cuda_free());
    mark = cuda_free();
    CUDA_ARRAY3D_DESCRIPTOR dm = {.Width = 256, .Height = 256, .Format = CU_AD_FORMAT_UNSIGNED_INT8,
                                  .NumChannels = 4};
    EXPECT(cuMipmappedArrayCreate(&mip, &dm, 3), CUDA_SUCCESS);
    KV("mipmap3_bytes", "%zu", mark - cuda_free());
    EXPECT(cuMipmappedArrayCreate(&mip, &dm, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMipmappedArrayCreate(&mip, &dm, 10), CUDA_ERROR_INVALID_VALUE);
    d2.Format = (CUarray_format)0x77;
    EXPECT(cuArrayCreate_v2(&array2, &d2) == CUDA_SUCCESS, 0);
    EXPECT(cuArrayDestroy(array1), CUDA_SUCCESS);
    EXPECT(cuArrayDestroy(array3), CUDA_SUCCESS);
    EXPECT(cuArrayDestroy(array3), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuMipmappedArrayDestroy(mip), CUDA_SUCCESS);
    EXPECT(cuArrayDestroy(array2), CUDA_SUCCESS);
    EXPECT(cuda_free(), base);
    EXPECT(cuMemRelease(host_handle), CUDA_SUCCESS);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
}

static void launches(void)
{
    CUcontext context = NULL;
    CUfunction function = (CUfunction)0x1;
    unsigned int micros = 2000;
    void *params[] = {&micros};
    EXPECT(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL),
           CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
    CUstream stream = NULL;
    EXPECT(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
    EXPECT(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    EXPECT(cuLaunchKernel_ptsz(function, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    EXPECT(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL), CUDA_SUCCESS);
    EXPECT(cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuLaunchKernel(function, 0, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, (CUstream)0x999, NULL, NULL),
           CUDA_ERROR_INVALID_HANDLE);
    CUlaunchConfig config = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 64,
                             .blockDimY = 1, .blockDimZ = 1, .hStream = stream};
    EXPECT(cuLaunchKernelEx(&config, function, params, NULL), CUDA_SUCCESS);
    EXPECT(cuLaunchKernelEx_ptsz(&config, function, params, NULL), CUDA_SUCCESS);
    EXPECT(cuLaunchKernelEx(NULL, function, params, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchCooperativeKernel(function, 1, 1, 1, 32, 1, 1, 0, NULL, params), CUDA_SUCCESS);
    EXPECT(cuLaunchCooperativeKernel_ptsz(function, 1, 1, 1, 32, 1, 1, 0, NULL, params),
           CUDA_SUCCESS);
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    EXPECT(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
    EXPECT(gpushareMockGraphSetKernelCount(graph, 3), CUDA_SUCCESS);
    EXPECT(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, NULL), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch_ptsz(exec, stream), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch((CUgraphExec)graph, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(NULL), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(graph), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(graph), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_ERROR_INVALID_HANDLE);
    int value = 0;
    EXPECT(cuFuncGetAttribute(&value, 0, function), CUDA_SUCCESS);
    KV("func_max_threads", "%d", value);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
}

static void proc_address(void)
{
    void *function = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    EXPECT(cuGetProcAddress("cuMemAlloc", &function, 12000, 0), CUDA_SUCCESS);
    EXPECT_TRUE(function == (void *)cuMemAlloc_v2);
    EXPECT(cuGetProcAddress_v2("cuLaunchKernel", &function, 12000,
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status),
           CUDA_SUCCESS);
    EXPECT_TRUE(function == (void *)cuLaunchKernel_ptsz);
    EXPECT(cuGetProcAddress_v2("cuNoSuchThing", &function, 12000, 0, &status), CUDA_SUCCESS);
    EXPECT(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    EXPECT_TRUE(function == NULL);
    EXPECT(cuGetProcAddress("cuNoSuchThing", &function, 12000, 0), CUDA_ERROR_NOT_FOUND);
    EXPECT(cuGetProcAddress(NULL, &function, 12000, 0), CUDA_ERROR_INVALID_VALUE);
}

static void nvml(void)
{
    unsigned int count = 0, index = 9, value = 0;
    nvmlDevice_t device = NULL, by_uuid = NULL;
    char name[96], uuid[96];
    EXPECT(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetHandleByIndex_v2(count, &device) == NVML_SUCCESS, 0);
    EXPECT(nvmlDeviceGetName(device, name, sizeof name), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetName(device, name, 2), NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT(nvmlDeviceGetUUID(device, uuid, sizeof uuid), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetHandleByUUID(uuid, &by_uuid), NVML_SUCCESS);
    EXPECT_TRUE(by_uuid == device);
    EXPECT(nvmlDeviceGetHandleByUUID("GPU-nope", &by_uuid), NVML_ERROR_NOT_FOUND);
    EXPECT(nvmlDeviceGetIndex(device, &index), NVML_SUCCESS);
    EXPECT(index, 0);
    KV("nvml_count", "%u", count);
    KV("nvml_name", "%s", name);
    KV("nvml_uuid", "%s", uuid);
    nvmlMemory_t memory = {0};
    nvmlMemory_v2_t memory2 = {.version = NVML_MEMORY_V2};
    EXPECT(nvmlDeviceGetMemoryInfo(device, &memory), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetMemoryInfo_v2(device, &memory2), NVML_SUCCESS);
    EXPECT(memory2.total, memory.total);
    memory2.version = 1;
    EXPECT(nvmlDeviceGetMemoryInfo_v2(device, &memory2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    KV("nvml_total", "%llu", memory.total);
    nvmlUtilization_t utilization = {0};
    EXPECT(nvmlDeviceGetUtilizationRates(device, &utilization), NVML_SUCCESS);
    KV("nvml_util", "%u", utilization.gpu);
    unsigned int processes = 0;
    EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(device, &processes, NULL), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetTemperature(device, NVML_TEMPERATURE_GPU, &value), NVML_SUCCESS);
    KV("nvml_temperature", "%u", value);
    EXPECT(nvmlDeviceGetPowerUsage(device, &value), NVML_SUCCESS);
    KV("nvml_power_mw", "%u", value);
    EXPECT(nvmlDeviceGetMinorNumber(device, &value), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetName(NULL, name, sizeof name), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(strcmp(nvmlErrorString(NVML_ERROR_INSUFFICIENT_SIZE), "Insufficient Size") == 0);

    /* With a context and an allocation, this process is listed. */
    CUcontext context = NULL;
    CUdeviceptr pointer = 0;
    EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
    EXPECT(cuMemAlloc_v2(&pointer, 5 * MIB), CUDA_SUCCESS);
    processes = 0;
    EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(device, &processes, NULL),
           NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT(processes, 1);
    nvmlProcessInfo_t info[4];
    processes = 4;
    EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(device, &processes, info), NVML_SUCCESS);
    EXPECT(processes, 1);
    EXPECT(info[0].pid, getpid());
    KV("nvml_process_used", "%llu", info[0].usedGpuMemory);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
    EXPECT(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    before_init();
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    nvmlDevice_t nvml0 = NULL;
    EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &nvml0), NVML_SUCCESS);
    devices();
    contexts(nvml0);
    memory(nvml0);
    pools();
    vmm_and_arrays();
    launches();
    proc_address();
    nvml();
    KV("failures", "%d", mock_failures);
    return mock_failures == 0 ? 0 : 1;
}
