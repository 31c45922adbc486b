/*
 * intercept_info [BYTES]: what a program sees of its slice. Creates a context, allocates BYTES
 * (if given) and prints cuMemGetInfo, cuDeviceTotalMem and NVML memory info (v1 and v2):
 *   cu_free= cu_total= cu_device_total= nvml_total= nvml_used= nvml_free=
 *   nvml2_total= nvml2_used= nvml2_free= alloc_rc=
 */
#include "intercept_util.h"

int main(int argc, char **argv) {
    CUcontext context = test_context();
    CUdeviceptr pointer = 0;
    if (argc > 1) {
        CUresult rc = cuMemAlloc_v2(&pointer, (size_t)strtoull(argv[1], NULL, 0));
        printf("alloc_rc=%d\n", (int)rc);
    }
    size_t free_bytes = 0, total_bytes = 0, device_total = 0;
    EXPECT_RC(cuMemGetInfo_v2(&free_bytes, &total_bytes), CUDA_SUCCESS);
    EXPECT_RC(cuDeviceTotalMem_v2(&device_total, 0), CUDA_SUCCESS);
    printf("cu_free=%zu\ncu_total=%zu\ncu_device_total=%zu\n", free_bytes, total_bytes,
           device_total);

    EXPECT_RC(nvmlInit_v2(), NVML_SUCCESS);
    nvmlDevice_t device;
    EXPECT_RC(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);
    nvmlMemory_t memory;
    EXPECT_RC(nvmlDeviceGetMemoryInfo(device, &memory), NVML_SUCCESS);
    printf("nvml_total=%llu\nnvml_used=%llu\nnvml_free=%llu\n", memory.total, memory.used,
           memory.free);
    nvmlMemory_v2_t memory2 = {.version = NVML_MEMORY_V2};
    EXPECT_RC(nvmlDeviceGetMemoryInfo_v2(device, &memory2), NVML_SUCCESS);
    printf("nvml2_total=%llu\nnvml2_used=%llu\nnvml2_free=%llu\nnvml2_reserved=%llu\n",
           memory2.total, memory2.used, memory2.free, memory2.reserved);
    EXPECT_RC(nvmlShutdown(), NVML_SUCCESS);
    if (pointer != 0) {
        EXPECT_RC(cuMemFree_v2(pointer), CUDA_SUCCESS);
    }
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
