/*
 * intercept_pooldev BYTES: with a context on device 0 current, allocates BYTES from device 1's
 * default pool (cuMemAllocFromPoolAsync), which the driver reserves on device 1.
 *   rc= (then, if it succeeded, frees it and trims the pool)
 */
#include "intercept_util.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        return 2;
    }
    CUcontext context = test_context();
    CUmemoryPool pool;
    EXPECT_RC(cuDeviceGetDefaultMemPool(&pool, 1), CUDA_SUCCESS);
    CUdeviceptr pointer = 0;
    CUresult rc = cuMemAllocFromPoolAsync(&pointer, (size_t)strtoull(argv[1], NULL, 0), pool, NULL);
    printf("rc=%d\n", (int)rc);
    if (rc == CUDA_SUCCESS) {
        EXPECT_RC(cuMemFreeAsync(pointer, NULL), CUDA_SUCCESS);
        EXPECT_RC(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    }
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
