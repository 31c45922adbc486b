/*
 * mock_threads: several threads share one context and allocate, free, launch, synchronise and
 * query NVML at once; for the ThreadSanitizer build. Prints failures=0 when all went well.
 */
#include "gpushare/driver_types.h"
#include "mock_check.h"

#include <pthread.h>
#include <stdatomic.h>

#define THREADS 8
#define ROUNDS 200

static CUcontext g_context;
static atomic_int g_errors;

static void *worker(void *arg)
{
    (void)arg;
    unsigned int micros = 5;
    void *params[] = {&micros};
    nvmlDevice_t device = NULL;
    if (cuCtxSetCurrent(g_context) != CUDA_SUCCESS ||
        nvmlDeviceGetHandleByIndex_v2(0, &device) != NVML_SUCCESS) {
        atomic_fetch_add(&g_errors, 1);
        return NULL;
    }
    for (int i = 0; i < ROUNDS; i++) {
        CUdeviceptr pointer = 0, async = 0;
        nvmlMemory_t memory;
        nvmlUtilization_t utilization;
        if (cuMemAlloc_v2(&pointer, 4096) != CUDA_SUCCESS ||
            cuMemAllocAsync(&async, 4096, NULL) != CUDA_SUCCESS ||
            cuLaunchKernel((CUfunction)0x1, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) !=
                CUDA_SUCCESS ||
            nvmlDeviceGetMemoryInfo(device, &memory) != NVML_SUCCESS ||
            nvmlDeviceGetUtilizationRates(device, &utilization) != NVML_SUCCESS ||
            cuMemFreeAsync(async, NULL) != CUDA_SUCCESS || cuMemFree_v2(pointer) != CUDA_SUCCESS)
            atomic_fetch_add(&g_errors, 1);
        if (i % 50 == 0 && cuStreamSynchronize(NULL) != CUDA_SUCCESS)
            atomic_fetch_add(&g_errors, 1);
    }
    return NULL;
}

int main(void)
{
    pthread_t threads[THREADS];
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT(cuCtxCreate_v2(&g_context, 0, 0), CUDA_SUCCESS);
    for (int i = 0; i < THREADS; i++)
        EXPECT(pthread_create(&threads[i], NULL, worker, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        EXPECT(pthread_join(threads[i], NULL), 0);
    EXPECT(atomic_load(&g_errors), 0);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT(cuCtxDestroy_v2(g_context), CUDA_SUCCESS);
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    KV("failures", "%d", mock_failures);
    return mock_failures == 0 ? 0 : 1;
}
