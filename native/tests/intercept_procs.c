/*
 * intercept_procs BYTES: creates a context, allocates BYTES and lists the device's processes
 * with nvmlDeviceGetComputeRunningProcesses_v3, the way nvidia-smi does: a size query first
 * (count 0), a buffer one entry short (when there is more than one), then a big enough one.
 *   self= alloc_rc= query_rc= query_count= short_rc= short_count= rc= count= procs=pid:used,...
 */
#include <unistd.h>

#include "intercept_util.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        return 2;
    }
    CUcontext context = test_context();
    CUdeviceptr pointer = 0;
    printf("self=%d\n", (int)getpid());
    printf("alloc_rc=%d\n", (int)cuMemAlloc_v2(&pointer, (size_t)strtoull(argv[1], NULL, 0)));
    EXPECT_RC(nvmlInit_v2(), NVML_SUCCESS);
    nvmlDevice_t device;
    EXPECT_RC(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);
    unsigned int count = 0;
    nvmlReturn_t rc = nvmlDeviceGetComputeRunningProcesses_v3(device, &count, NULL);
    printf("query_rc=%d\nquery_count=%u\n", (int)rc, count);
    nvmlProcessInfo_t infos[64];
    if (count > 1) {
        unsigned int shorter = count - 1;
        rc = nvmlDeviceGetComputeRunningProcesses_v3(device, &shorter, infos);
        printf("short_rc=%d\nshort_count=%u\n", (int)rc, shorter);
    }
    count = 64;
    rc = nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos);
    printf("rc=%d\ncount=%u\nprocs=", (int)rc, count);
    for (unsigned int i = 0; rc == NVML_SUCCESS && i < count; i++) {
        printf("%s%u:%llu", i == 0 ? "" : ",", infos[i].pid, infos[i].usedGpuMemory);
        EXPECT(infos[i].gpuInstanceId == 0xFFFFFFFFu && infos[i].computeInstanceId == 0xFFFFFFFFu);
    }
    printf("\n");
    EXPECT_RC(nvmlShutdown(), NVML_SUCCESS);
    if (pointer != 0) {
        EXPECT_RC(cuMemFree_v2(pointer), CUDA_SUCCESS);
    }
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
