/*
 * intercept_pooldev [MODE] BYTES: a stream-ordered allocation of BYTES that the driver reserves
 * on device 1 while a context on device 0 is current.
 *   default  cuMemAllocFromPoolAsync from device 1's default pool
 *   created  cuMemAllocFromPoolAsync from a pool made with cuMemPoolCreate on device 1
 *   current  cuMemAllocFromPoolAsync from cuDeviceGetMemPool(1)
 *   stream   cuMemAllocAsync on a stream of a device-1 context (device 1's current pool); the
 *            caller's context must still be current afterwards
 * Prints rc= (then, if it succeeded, frees it and trims the pool).
 */
#include <string.h>

#include "intercept_util.h"

static CUresult from_pool(CUmemoryPool pool, size_t bytes) {
    CUdeviceptr pointer = 0;
    CUresult rc = cuMemAllocFromPoolAsync(&pointer, bytes, pool, NULL);
    if (rc == CUDA_SUCCESS) {
        EXPECT_RC(cuMemFreeAsync(pointer, NULL), CUDA_SUCCESS);
        EXPECT_RC(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    }
    return rc;
}

static CUresult created_pool(size_t bytes) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    CUmemoryPool pool = NULL;
    EXPECT_RC(cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
    CUresult rc = from_pool(pool, bytes);
    EXPECT_RC(cuMemPoolDestroy(pool), CUDA_SUCCESS);
    return rc;
}

static CUresult on_other_stream(CUcontext current, size_t bytes) {
    CUcontext other = NULL;
    CUstream stream = NULL;
    EXPECT_RC(cuCtxCreate_v2(&other, 0, 1), CUDA_SUCCESS); /* becomes current */
    EXPECT_RC(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSetCurrent(current), CUDA_SUCCESS);
    CUdeviceptr pointer = 0;
    CUresult rc = cuMemAllocAsync(&pointer, bytes, stream);
    CUcontext after = NULL;
    EXPECT_RC(cuCtxGetCurrent(&after), CUDA_SUCCESS);
    printf("current_kept=%d\n", after == current);
    if (rc == CUDA_SUCCESS) {
        EXPECT_RC(cuMemFreeAsync(pointer, stream), CUDA_SUCCESS);
    }
    CUmemoryPool pool = NULL;
    EXPECT_RC(cuDeviceGetMemPool(&pool, 1), CUDA_SUCCESS);
    EXPECT_RC(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    EXPECT_RC(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
    EXPECT_RC(cuCtxDestroy_v2(other), CUDA_SUCCESS);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        return 2;
    }
    const char *mode = argc == 3 ? argv[1] : "default";
    size_t bytes = (size_t)strtoull(argv[argc - 1], NULL, 0);
    CUcontext context = test_context();
    CUresult rc;
    if (strcmp(mode, "default") == 0 || strcmp(mode, "current") == 0) {
        CUmemoryPool pool;
        if (strcmp(mode, "default") == 0) {
            EXPECT_RC(cuDeviceGetDefaultMemPool(&pool, 1), CUDA_SUCCESS);
        } else {
            EXPECT_RC(cuDeviceGetMemPool(&pool, 1), CUDA_SUCCESS);
        }
        rc = from_pool(pool, bytes);
    } else if (strcmp(mode, "created") == 0) {
        rc = created_pool(bytes);
    } else if (strcmp(mode, "stream") == 0) {
        rc = on_other_stream(context, bytes);
    } else {
        return 2;
    }
    printf("rc=%d\n", (int)rc);
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
