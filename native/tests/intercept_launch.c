/*
 * intercept_launch MILLISECONDS KERNEL_US: launch kernels of KERNEL_US (the mock runs a kernel
 * for *params[0] microseconds) for MILLISECONDS of wall time, synchronising every 4 launches the
 * way a dependent workload does, alternating cuLaunchKernel, cuLaunchKernel_ptsz and
 * cuLaunchKernelEx. Prints the achieved share of GPU time over the whole run and over its second
 * half (after the launch-cost feedback has settled):
 *   launches= share_percent= late_share_percent=
 */
#include <time.h>

#include "intercept_util.h"

static double now_s(void) {
    struct timespec ts;
    EXPECT(clock_gettime(CLOCK_MONOTONIC, &ts) == 0);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        return 2;
    }
    double duration = atof(argv[1]) / 1000.0;
    unsigned int kernel_us = (unsigned int)atoi(argv[2]);
    CUcontext context = test_context();
    CUfunction function = (CUfunction)0x1000; /* the mock accepts any non-null function */
    void *params[] = {&kernel_us};
    CUlaunchConfig config = {1, 1, 1, 32, 1, 1, 0, NULL, NULL, 0};
    double start = now_s(), half = start + duration / 2;
    long launches = 0, late_launches = 0;
    double late_start = 0;
    while (now_s() - start < duration) {
        CUresult rc;
        switch (launches % 3) {
        case 0:
            rc = cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
            break;
        case 1:
            rc = cuLaunchKernel_ptsz(function, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
            break;
        default:
            rc = cuLaunchKernelEx(&config, function, params, NULL);
            break;
        }
        EXPECT_RC(rc, CUDA_SUCCESS);
        launches++;
        if (launches % 4 == 0) {
            EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
            double t = now_s();
            if (t >= half) {
                if (late_start == 0) {
                    late_start = t;
                } else {
                    late_launches += 4;
                }
            }
        }
    }
    EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
    double end = now_s();
    printf("launches=%ld\nshare_percent=%.1f\nlate_share_percent=%.1f\n", launches,
           100.0 * (double)launches * kernel_us / 1e6 / (end - start),
           late_start > 0 ? 100.0 * (double)late_launches * kernel_us / 1e6 / (end - late_start)
                          : 0.0);
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
