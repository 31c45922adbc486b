/*
 * Helpers shared by the intercept_*.c test programs: they print key=value lines for the pytest
 * side to check, and exit non-zero on anything unexpected.
 */
#ifndef GPUSHARE_INTERCEPT_UTIL_H
#define GPUSHARE_INTERCEPT_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "gpushare/driver_types.h"

#define MIB (1024ull * 1024ull)

#define EXPECT_RC(call, want)                                                                    \
    do {                                                                                         \
        int rc_ = (int)(call);                                                                   \
        if (rc_ != (int)(want)) {                                                                \
            fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call,   \
                    rc_, (int)(want));                                                           \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

#define EXPECT(cond)                                                                             \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);                  \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

/* cuInit + a context on device 0 (cuCtxCreate_v2) made current. */
static inline CUcontext test_context(void) {
    CUdevice device;
    CUcontext context;
    EXPECT_RC(cuInit(0), CUDA_SUCCESS);
    EXPECT_RC(cuDeviceGet(&device, 0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxCreate_v2(&context, 0, device), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSetCurrent(context), CUDA_SUCCESS);
    return context;
}

static inline unsigned long long test_used(void) {
    size_t free_bytes = 0, total_bytes = 0;
    EXPECT_RC(cuMemGetInfo_v2(&free_bytes, &total_bytes), CUDA_SUCCESS);
    return (unsigned long long)(total_bytes - free_bytes);
}

#endif
