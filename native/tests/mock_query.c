/*
 * mock_query DEVICE: what another process sees of DEVICE. Prints NVML's memory use and process
 * list (nvml_used, nvml_processes, nvml_pids), then, with a context of its own,
 * cuMemGetInfo's free and total (cuda_free, cuda_total) and this context's overhead.
 */
#include "gpushare/driver_types.h"
#include "mock_check.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mock_query DEVICE\n");
        return 2;
    }
    unsigned int index = (unsigned int)atoi(argv[1]);
    nvmlDevice_t device = NULL;
    nvmlMemory_t memory = {0};
    nvmlProcessInfo_t infos[16];
    unsigned int count = 16;
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetHandleByIndex_v2(index, &device), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetMemoryInfo(device, &memory), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos), NVML_SUCCESS);
    if (mock_failures)
        return 1;
    KV("nvml_used", "%llu", memory.used);
    KV("nvml_processes", "%u", count);
    printf("nvml_pids=");
    for (unsigned int i = 0; i < count; i++)
        printf("%s%u:%llu", i ? "," : "", infos[i].pid, infos[i].usedGpuMemory);
    printf("\n");
    CUcontext context = NULL;
    size_t free_bytes = 0, total = 0;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuCtxCreate_v2(&context, 0, (CUdevice)index), CUDA_SUCCESS);
    EXPECT(cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
    EXPECT(nvmlDeviceGetMemoryInfo(device, &memory), NVML_SUCCESS);
    KV("cuda_free", "%zu", free_bytes);
    KV("cuda_total", "%zu", total);
    KV("nvml_used_with_own_context", "%llu", memory.used);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    return mock_failures == 0 ? 0 : 1;
}
