/*
 * mock_hold DEVICE MIB [KERNEL_US]: creates a context on DEVICE, allocates MIB MiB (and, with
 * KERNEL_US, queues one kernel of that many microseconds), prints "ready", then holds everything
 * until its stdin closes or yields a line. Lets tests put a second process on the device.
 */
#include "gpushare/driver_types.h"
#include "mock_check.h"

#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mock_hold DEVICE MIB [KERNEL_US]\n");
        return 2;
    }
    int device = atoi(argv[1]);
    unsigned long long mib = strtoull(argv[2], NULL, 10);
    CUcontext context = NULL;
    CUdeviceptr pointer = 0;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuCtxCreate_v2(&context, 0, device), CUDA_SUCCESS);
    if (mib > 0)
        EXPECT(cuMemAlloc_v2(&pointer, mib * MIB), CUDA_SUCCESS);
    if (argc > 3) {
        unsigned int micros = (unsigned int)strtoul(argv[3], NULL, 10);
        void *params[] = {&micros};
        EXPECT(cuLaunchKernel((CUfunction)0x1, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
               CUDA_SUCCESS);
    }
    if (mock_failures)
        return 1;
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        line[0] = '\0'; /* stdin closed: release as well */
    if (mib > 0)
        EXPECT(cuMemFree_v2(pointer), CUDA_SUCCESS);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    printf("done\n");
    return mock_failures == 0 ? 0 : 1;
}
