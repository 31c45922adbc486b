/*
 * mock_timeline queue N US     launch N kernels of US microseconds on device 0, then
 *                              synchronise; prints launch_ms and sync_ms.
 * mock_timeline duty BUSY IDLE CYCLES
 *                              CYCLES times: a BUSY-microsecond kernel, synchronise, sleep IDLE
 *                              microseconds; then prints NVML's utilisation (nvml_util).
 * mock_timeline graph N        launch a graph counted as N kernels; prints sync_ms.
 */
#include "gpushare/driver_types.h"
#include "mock_check.h"

#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
        return 0;
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

static void sleep_us(unsigned long micros)
{
    struct timespec delay = {.tv_sec = (time_t)(micros / 1000000u),
                             .tv_nsec = (long)(micros % 1000000u) * 1000};
    while (nanosleep(&delay, &delay) != 0) {
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: see the comment at the top of mock_timeline.c\n");
        return 2;
    }
    CUcontext context = NULL;
    CUfunction function = (CUfunction)0x1;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
    if (mock_failures)
        return 1;
    if (strcmp(argv[1], "queue") == 0 && argc >= 4) {
        unsigned int count = (unsigned int)atoi(argv[2]);
        unsigned int micros = (unsigned int)atoi(argv[3]);
        void *params[] = {&micros};
        double start = now_ms();
        for (unsigned int i = 0; i < count; i++)
            EXPECT(cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                   CUDA_SUCCESS);
        double launched = now_ms();
        EXPECT(cuStreamSynchronize(NULL), CUDA_SUCCESS);
        double synced = now_ms();
        KV("launch_ms", "%.3f", launched - start);
        KV("sync_ms", "%.3f", synced - start);
    } else if (strcmp(argv[1], "duty") == 0 && argc >= 5) {
        unsigned int busy = (unsigned int)atoi(argv[2]);
        unsigned long idle = strtoul(argv[3], NULL, 10);
        int cycles = atoi(argv[4]);
        void *params[] = {&busy};
        for (int i = 0; i < cycles; i++) {
            EXPECT(cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                   CUDA_SUCCESS);
            EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
            sleep_us(idle);
        }
        nvmlDevice_t device = NULL;
        nvmlUtilization_t utilization = {0};
        EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);
        EXPECT(nvmlDeviceGetUtilizationRates(device, &utilization), NVML_SUCCESS);
        KV("nvml_util", "%u", utilization.gpu);
    } else if (strcmp(argv[1], "graph") == 0) {
        CUgraph graph = NULL;
        CUgraphExec exec = NULL;
        EXPECT(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
        EXPECT(gpushareMockGraphSetKernelCount(graph, (unsigned int)atoi(argv[2])), CUDA_SUCCESS);
        EXPECT(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
        double start = now_ms();
        EXPECT(cuGraphLaunch(exec, NULL), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(NULL), CUDA_SUCCESS);
        KV("sync_ms", "%.3f", now_ms() - start);
        EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
        EXPECT(cuGraphDestroy(graph), CUDA_SUCCESS);
    } else {
        fprintf(stderr, "mock_timeline: unknown mode %s\n", argv[1]);
        return 2;
    }
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    return mock_failures == 0 ? 0 : 1;
}
